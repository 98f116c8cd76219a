"""Self-describing codecs (pushpull.compression): a codec is one file that declares its name, wire id
and options and registers itself; the one registry finds it by id and by name, and nothing else needs
an edit. The test adds one (an 8-bit linear quantiser, tests/extension_files.py) in a temporary
``pushpull/compression`` directory and round-trips it through the registry in this process;
tests/cluster/test_codec_registry.py runs it in a real push_pull job. Then which tensors are
compressed (compression.for_tensor)."""
from __future__ import annotations

import pytest
import torch

import pushpull.compression as comp
from extension_files import codec_file


@pytest.fixture()
def int8q(tmp_path):
    """The new codec's file, on pushpull.compression's path while the test runs (tests/extension_files.py)."""
    with codec_file(tmp_path) as root:
        yield root


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
    from pushpull.compression.base import Codec, register_codec

    class Clash(Codec):
        codec = 2
        name = "clash"

    with pytest.raises(ValueError, match="codec id 2"):
        register_codec(Clash)


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
