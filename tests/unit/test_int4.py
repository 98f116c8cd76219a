"""The 4-bit codec (pushpull/compression/int4.py): two elements per byte, a float32 scale per group."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pushpull.compression import build, decode_payload


def _roundtrip(x: torch.Tensor, **opts) -> tuple[torch.Tensor, int]:
    payload = build({"compressor": "int4", **opts}).compress(x)
    return decode_payload(payload.buffer), payload.buffer.numel()


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 1001])
def test_every_element_is_within_half_a_step_of_its_group(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * torch.logspace(-3, 3, n)
    y, _ = _roundtrip(x)
    for i in range(0, n, 64):
        group = x[i:i + 64]
        step = group.abs().max() / 7
        assert (group - y[i:i + 64]).abs().max() <= step / 2 * (1 + 1e-6)


def test_zero_and_the_group_maximum_are_exact():
    x = torch.tensor([0.0, 3.5, -3.5, 0.0] * 16)
    y, _ = _roundtrip(x)
    assert torch.equal(y, x)


def test_a_group_of_zeros_stays_zero():
    y, _ = _roundtrip(torch.zeros(130))
    assert torch.equal(y, torch.zeros(130))


def test_about_an_eighth_of_the_bytes():
    _, nbytes = _roundtrip(torch.randn(1 << 16))
    assert nbytes < 4 * (1 << 16) / 7  # 4.5 bits per element with groups of 64, plus the header


@pytest.mark.parametrize("group", [1, 7, 256])
def test_the_group_size_is_honoured(group):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(group))
    y, nbytes = _roundtrip(x, group=group)
    assert (x - y).abs().max() <= x.abs().max() / 14 * (1 + 1e-6)
    assert nbytes >= 500 + 4 * ((1000 + group - 1) // group)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64"])
def test_a_bad_group_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="group must be an integer"):
        build({"compressor": "int4", "group": bad})


def test_float16_input_decodes_to_float16():
    x = torch.randn(100).to(torch.float16)
    y, _ = _roundtrip(x)
    assert y.dtype == torch.float16 and np.allclose(y.float().numpy(), x.float().numpy(), atol=0.5)
