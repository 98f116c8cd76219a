"""Self-describing codecs (pushpull.compression): a codec is one file that declares its name, wire id
and options and registers itself; the one registry finds it by id and by name, and nothing else needs
an edit. The test adds one (an 8-bit linear quantiser) in a temporary ``pushpull/compression``
directory, round-trips it through the registry in this process, and runs it in a real push_pull job
whose workers and server find it on their ``sys.path``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pushpull.compression as comp

ROOT = Path(__file__).resolve().parents[2]

INT8 = textwrap.dedent('''
    """int8q: each value as one signed byte of max|x| / 127 (a test codec)."""
    import torch

    from pushpull.compression.base import Compressor, Option, Payload, flat_input, output_for, register_codec


    def _check_levels(v):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 127:
            raise ValueError(f"compression spec: levels must be a whole number in [1, 127], got {v!r}")


    @register_codec
    class Int8Q(Compressor):
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


@pytest.fixture()
def int8q(tmp_path):
    pkg = tmp_path / "pushpull" / "compression"
    pkg.mkdir(parents=True)
    (pkg / "int8q.py").write_text(INT8)
    comp.__path__.append(str(pkg))
    comp.discover()
    yield tmp_path
    comp.__path__.remove(str(pkg))
    from pushpull.compression.base import _CODECS
    _CODECS.pop(200, None)  # the registry is per process: leave it as the other tests expect
    sys.modules.pop("pushpull.compression.int8q", None)


def test_the_registry_lists_the_builtin_codecs_by_wire_id():
    assert [(c.codec, c.name) for c in comp.codecs()][:6] == [(0, "none"), (1, "fp16"), (2, "onebit"), (3, "topk"),
                                                             (4, "randomk"), (5, "dithering")]


def test_a_codec_file_registers_its_name_id_and_options(int8q):
    assert comp.codec_by_name("int8q").codec == 200 and "int8q" in comp.COMPRESSORS
    spec = comp.normalize_spec("int8q")
    assert spec["levels"] == 127 and spec["compressor"] == "int8q"


def test_its_option_is_validated_by_its_own_check(int8q):
    with pytest.raises(ValueError, match="levels"):
        comp.normalize_spec({"compressor": "int8q", "levels": 300})


def test_it_round_trips_through_the_registry(int8q):
    x = torch.linspace(-2.0, 2.0, 1001)
    chain = comp.build({"compressor": "int8q", "levels": 100, "ef": "vanilla"})
    payload = chain.compress(x)
    assert payload.codec == 200 and payload.nbytes < x.numel() * 4 / 3
    got = comp.decode_payload(payload.to_buffer())  # decoded by wire id alone, as a server does
    assert torch.allclose(got, x, atol=2.0 / 100 / 2 + 1e-6)


def test_two_codecs_cannot_share_a_wire_id():
    from pushpull.compression.base import Compressor, register_codec

    class Clash(Compressor):
        codec = 2
        name = "clash"

    with pytest.raises(ValueError, match="codec id 2"):
        register_codec(Clash)


WORKER = textwrap.dedent('''
    import torch
    import pushpull.torch as bps

    bps.init()
    r, n = bps.rank(), bps.size()
    x = torch.linspace(-1.0, 1.0, 40_000) * (r + 1)
    for step in range(3):
        got = bps.push_pull(x, average=False, name="int8q.t", compression={"compressor": "int8q"})
        want = torch.linspace(-1.0, 1.0, 40_000) * sum(k + 1 for k in range(n))
        err = (got - want).abs().max().item()
        # each worker's push and the server's re-compressed sum: at most half a step each
        bound = 0.5 * sum(k + 1 for k in range(n)) / 127 + 0.5 * want.abs().max().item() / 127 + 1e-5
        assert err <= bound, (step, err, bound)
    print("ALL-OK", flush=True)
    bps.shutdown()
''')


def test_a_real_push_pull_uses_the_new_codec(int8q):
    script = int8q / "int8q_worker.py"
    script.write_text(WORKER)
    path = os.pathsep.join([str(int8q), os.environ.get("PYTHONPATH", str(ROOT))])
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1",
            "--env", "PUSHPULL_TIMEOUT=40", "--env", f"PYTHONPATH={path}", "--env", "PUSHPULL_MIN_COMPRESS_BYTES=0",
            "--", sys.executable, str(script)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.count("ALL-OK") == 2, (res.stdout + res.stderr)[-5000:]


# -------------------------------------------------- which tensors are compressed (compression.for_tensor) --
ONEBIT_NM = {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"}


def test_a_tensor_at_the_minimum_size_is_compressed():
    assert comp.for_tensor({"compressor": "onebit"}, 65536, True, 65536)["compressor"] == "onebit"


def test_a_smaller_tensor_is_sent_raw():
    assert comp.for_tensor({"compressor": "onebit"}, 65535, True, 65536) is None


def test_the_spec_minimum_wins_over_the_setting():
    assert comp.for_tensor({"compressor": "onebit", "min_compress_bytes": 0}, 4, True, 65536) is not None


def test_an_integer_tensor_is_never_compressed():
    assert comp.for_tensor(ONEBIT_NM, 1 << 20, False, 0) is None


def test_momentum_still_applies_to_a_tensor_too_small_to_compress():
    got = comp.for_tensor(ONEBIT_NM, 400, True, 65536)
    assert (got["compressor"], got["ef"], got["momentum"]) == ("none", "none", "nesterov")


def test_a_spec_that_does_nothing_is_no_compression():
    assert comp.for_tensor({"compressor": "none"}, 1 << 20, True, 0) is None


def test_a_bad_spec_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="mu"):
        comp.for_tensor({"compressor": "onebit", "mu": 2}, 1 << 20, True, 0)
