"""8-bit integers with one scale per block: a quarter of fp32's bytes, for dense tensors such as DiLoCo's
pseudo-gradients (INTELLECT-1 sent them in int8; arXiv 2412.01152).

Why per block: one scale per tensor lets a single large element flatten every other one to zero; a scale per
``block`` elements (the block's largest magnitude / 127) keeps each block's relative error within 1/254 of
its own largest element, for 4 bytes per block. Rounding is to nearest: unbiased enough here, and error
feedback (``"ef": "vanilla"``) carries what is lost to the next round where it matters.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import (
    Codec, Option, Payload, block_scales, decode_into, elements_option, flat_input, output_for, register_codec,
)

LEVELS = 127  # symmetric: -127..127, so that 0 is exact and the scale is max|x| / 127


_check_block = elements_option("block")


@register_codec
class Int8(Codec):
    """Each element as round(x / s) in int8, ``s`` the float32 scale of its block of ``block`` elements."""

    codec = 6
    name = "int8"
    options = {"block": Option(256, _check_block, "elements per scale (int8)")}

    def __init__(self, block: int = 256):
        _check_block(block)
        self.block = int(block)

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = flat_input(tensor).numpy()
        n, b = x.size, self.block
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, param=b)
        q = payload.sections[0].numpy()
        scales = payload.sections[1].numpy()
        inv = block_scales(x, b, LEVELS, scales)
        full = n // b * b
        if full:
            q[:full] = np.rint(x[:full].reshape(-1, b) * inv[: full // b, None]).reshape(-1)
        if full < n:
            q[full:] = np.rint(x[full:] * inv[-1])
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        block = max(1, int(param))
        return [(torch.int8, numel), (torch.float32, (numel + block - 1) // block)]

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        out = output_for(payload, out)
        q = payload.sections[0].numpy()
        scales = payload.sections[1].numpy()
        b = max(1, payload.param)

        def fill(flat: torch.Tensor) -> None:
            f = flat.numpy()
            n = f.size
            full = n // b * b
            if full:
                np.multiply(q[:full].reshape(-1, b), scales[: full // b, None], out=f[:full].reshape(-1, b),
                            casting="unsafe")
            if full < n:
                np.multiply(q[full:], scales[-1], out=f[full:], casting="unsafe")
        return decode_into(out, fill)

    def __repr__(self) -> str:
        return f"Int8(block={self.block})"
