"""Gradient compression's wire format across processes: a payload decodes the same in another interpreter
(the codecs themselves: tests/unit/test_compression.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from pushpull.compression import FP16, Dithering, NoCompression, OneBit, RandomK, TopK, decode_payload

CODECS = {  # the codecs whose payloads cross processes here (all of them: tests/unit/test_compression.py)
    "none": lambda: NoCompression(),
    "fp16": lambda: FP16(),
    "onebit": lambda: OneBit(scaling=True),
    "topk": lambda: TopK(0.5),
    "randomk": lambda: RandomK(0.5, seed=1),
    "dithering": lambda: Dithering(2, seed=1),
    "dithering-natural-l2": lambda: Dithering(3, partition="natural", normalize="l2", seed=1),
}


def test_payload_decodes_in_another_process(tmp_path):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 1000, generator=gen)
    expected = {}
    for name in CODECS:
        payload = CODECS[name]().compress(x)
        (tmp_path / f"{name}.bin").write_bytes(bytes(payload.to_buffer()))
        expected[name] = decode_payload(payload)
    script = textwrap.dedent(f"""
        import pathlib, torch
        from pushpull.compression import decode_payload
        for path in sorted(pathlib.Path({str(tmp_path)!r}).glob("*.bin")):
            torch.save(decode_payload(path.read_bytes()), str(path) + ".pt")
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    for name, ref in expected.items():
        got = torch.load(tmp_path / f"{name}.bin.pt")
        assert got.shape == (3, 1000) and got.dtype == torch.float32
        assert torch.equal(got, ref), name
