"""The test strategy and the test codec, each one file written into a temporary ``pushpull/policy`` or
``pushpull/compression`` folder that this process adds to the package's search path (processes it
launches find the folder on their PYTHONPATH: pushpull.extend). tests/unit/test_policy.py and
tests/unit/test_codec_registry.py use them in this process, their tests/cluster namesakes in a real job;
they show that a new strategy and a new codec are each one file."""
from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PAIRS = textwrap.dedent('''
    """pairs: every two consecutive gradients (in ready order) travel as one buffer; a test strategy."""
    from pushpull.policy.base import Policy


    class Pairs(Policy):
        """consecutive gradients in twos"""
        name = "pairs"
        release = "plan"
        options = {"size": 2}

        @classmethod
        def plan(cls, ready_s, sizes, size=2, **_):
            return [list(range(i, min(i + size, len(sizes)))) for i in range(0, len(sizes), size)]
''')

INT8 = textwrap.dedent('''
    """int8q: each value as one signed byte of max|x| / 127 (a test codec)."""
    import torch

    from pushpull.compression.base import Codec, Option, Payload, flat_input, output_for, register_codec


    def _check_levels(v):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 127:
            raise ValueError(f"compression spec: levels must be a whole number in [1, 127], got {v!r}")


    @register_codec
    class Int8Q(Codec):
        codec = 200
        name = "int8q"
        options = {"levels": Option(127, _check_levels, "quantisation levels per sign")}

        def __init__(self, levels=127):
            self.levels = levels

        def compress(self, tensor):
            x = flat_input(tensor)
            scale = float(x.abs().max()) / self.levels if x.numel() else 0.0
            payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, scale=scale)
            q = torch.round(x / scale) if scale > 0 else torch.zeros_like(x)
            payload.sections[0].copy_(q.clamp(-self.levels, self.levels))
            return payload

        @staticmethod
        def layout(numel, dtype, param, count, flags):
            return [(torch.int8, numel)]

        @classmethod
        def decode(cls, payload, out):
            out = output_for(payload, out)
            out.view(-1).copy_(payload.sections[0].to(torch.float32) * payload.scale)
            return out
''')


@contextmanager
def strategy_file(tmp_path: Path) -> Iterator[Path]:
    """pairs.py in ``tmp_path``/pushpull/policy, a strategy while the block runs; yields ``tmp_path``."""
    import pushpull.policy as policy

    pkg = tmp_path / "pushpull" / "policy"
    pkg.mkdir(parents=True)
    (pkg / "pairs.py").write_text(PAIRS)
    policy.__path__.append(str(pkg))
    policy.refresh()
    try:
        yield tmp_path
    finally:
        policy.__path__.remove(str(pkg))
        sys.modules.pop("pushpull.policy.pairs", None)
        policy.refresh()


@contextmanager
def codec_file(tmp_path: Path) -> Iterator[Path]:
    """int8q.py in ``tmp_path``/pushpull/compression, a codec while the block runs; yields ``tmp_path``."""
    import pushpull.compression as comp
    from pushpull.compression.base import _CODECS

    pkg = tmp_path / "pushpull" / "compression"
    pkg.mkdir(parents=True)
    (pkg / "int8q.py").write_text(INT8)
    comp.__path__.append(str(pkg))
    comp.discover()
    try:
        yield tmp_path
    finally:
        comp.__path__.remove(str(pkg))
        _CODECS.pop(200, None)  # the registry is per process: leave it as the other tests expect
        sys.modules.pop("pushpull.compression.int8q", None)
