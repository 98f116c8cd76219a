"""The int8 codec (pushpull/compression/int8.py): one float32 scale per block, each element within half a
step of its block's scale, zeros exact, tails and every float dtype, the wire size, and the spec."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pushpull.compression import build, codec_by_name, decode_payload


@pytest.mark.parametrize("n", [1, 7, 256, 1000, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_each_element_within_half_a_step_of_its_block(n, dtype):
    x = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * torch.linspace(0.01, 10, n)).to(dtype)
    payload = build({"compressor": "int8", "block": 64}).compress(x)
    y = decode_payload(payload.buffer)
    assert y.dtype == dtype and y.shape == x.shape
    xf, yf = x.double().numpy(), y.double().numpy()
    pad = (-n) % 64
    step = np.abs(np.pad(xf, (0, pad))).reshape(-1, 64).max(1) / 127
    bound = np.repeat(step, 64)[:n] / 2 + np.abs(xf) * (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)
    assert np.all(np.abs(yf - xf) <= bound + 1e-12)


def test_zeros_and_a_zero_block_stay_exact():
    x = torch.zeros(300)
    x[:10] = torch.arange(10.0)
    y = decode_payload(build({"compressor": "int8", "block": 100}).compress(x).buffer)
    assert torch.equal(y[100:], torch.zeros(200)) and y[0] == 0 and torch.equal(y[10:100], torch.zeros(90))


def test_wire_size_is_a_byte_per_element_and_a_scale_per_block():
    payload = build({"compressor": "int8", "block": 256}).compress(torch.randn(10_000))
    blocks = -(-10_000 // 256)
    assert payload.buffer.numel() <= 48 + 10_000 + 8 + 4 * blocks + 8  # header and shape, body, aligned scales


@pytest.mark.parametrize("block", [0, 1.5, True, 1 << 25])
def test_a_bad_block_is_refused(block):
    with pytest.raises(ValueError, match="block"):
        build({"compressor": "int8", "block": block})


def test_registered_under_its_name():
    assert codec_by_name("int8").codec == 6
