"""The compression argument in each of its forms, normalised once (pushpull/worker/compression.py) and split
into a wire spec or a Horovod-style compressor below the API edge (pushpull/worker/context.py)."""
from __future__ import annotations

import pytest

from pushpull.worker.compression import Compression, Compressor, normalize
from pushpull.worker.context import split_compression


class Doubler(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor * 2, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor / 2


def test_none_and_compression_none_mean_no_compression():
    assert normalize(None) is None and normalize(Compression.none) is None and normalize({}) is None


def test_a_codec_name_is_a_wire_compressor():
    c = normalize("onebit")
    assert c.wire and c.spec == {"compressor": "onebit"}


def test_a_spec_without_a_compressor_keeps_its_momentum():
    c = normalize({"momentum": "nesterov"})
    assert c.wire and c.spec == {"compressor": "none", "momentum": "nesterov"}


def test_a_horovod_style_compressor_passes_through():
    assert normalize(Doubler) is Doubler


def test_a_bad_compressor_names_the_call_and_the_codec():
    with pytest.raises(ValueError, match=r"push_pull of 'c\.bad'.*zip"):
        normalize({"compressor": "zip"}, "push_pull of 'c.bad'")


def test_something_else_is_refused():
    with pytest.raises(TypeError, match="neither a pushpull compression"):
        normalize(3)


@pytest.mark.parametrize("form,spec", [("onebit", {"compressor": "onebit"}), (Compression.fp16, {"compressor": "fp16"}),
                                       ({"compressor": "topk", "k": 0.1}, {"compressor": "topk", "k": 0.1}),
                                       (None, None), ({}, None)])
def test_every_wire_form_splits_into_its_spec(form, spec):
    assert split_compression(form) == (spec, None)


def test_a_horovod_style_compressor_splits_into_itself():
    assert split_compression(Doubler) == (None, Doubler)
