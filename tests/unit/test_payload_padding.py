"""A payload's bytes are its contents only: the alignment gaps between its sections are zeroed, so no stale
process memory goes on the wire and a deterministic codec gives the same bytes for the same tensor."""
from __future__ import annotations

import pytest
import torch

from pushpull.compression import build


@pytest.mark.parametrize("spec", [{"compressor": "int8", "block": 7}, {"compressor": "int4"},
                                  {"compressor": "onebit"}, {"compressor": "topk", "k": 0.01},
                                  {"compressor": "randomk", "k": 0.01}, {"compressor": "fp16"}],
                         ids=lambda s: s["compressor"])
def test_the_same_tensor_gives_the_same_bytes(spec):
    x = torch.randn(10_007, generator=torch.Generator().manual_seed(5))
    garbage = [torch.full((1 << 16,), 0xAB, dtype=torch.uint8) for _ in range(8)]  # dirty the allocator
    first = bytes(build(spec).compress(x).buffer.numpy())
    del garbage
    second = bytes(build(spec).compress(x).buffer.numpy())
    assert first == second
