"""4-bit integers with one scale per block: two elements per byte, about an eighth of fp32's bytes (4.5 bits
per element with the default block), for DiLoCo's pseudo-gradients where int8 is not small enough
(Streaming DiLoCo, arXiv 2501.18512, exchanged them in 4 bits without a loss in quality).

Why per block, and a small one: with 15 levels a scale per tensor would flatten nearly everything to zero; a
scale per ``group`` elements (the group's largest magnitude / 7; the int8 codec's ``block``, under the name
quantizers give it, since one spec key has one default) keeps each element within 1/14 of its own group's
largest one. Groups of 64 cost half a bit per element in scales. Rounding is to nearest; error
feedback (``"ef": "vanilla"``) carries what is lost to the next round where it matters.

Layout: byte i holds element 2i in its low nibble and 2i+1 in its high one, each as q + 8 for q in -7..7
(so 0 is exact and the nibble 0 is never used).
"""

from __future__ import annotations

import numpy as np
import torch

from .base import (
    Codec, Option, Payload, block_scales, decode_into, elements_option, flat_input, output_for, register_codec,
)

LEVELS = 7  # symmetric: -7..7


_check_group = elements_option("group")


@register_codec
class Int4(Codec):
    """Each element as round(x / s) in 4 bits, ``s`` the float32 scale of its group of ``group`` elements."""

    codec = 7
    name = "int4"
    options = {"group": Option(64, _check_group, "elements per scale (int4)")}

    def __init__(self, group: int = 64):
        _check_group(group)
        self.group = int(group)

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = flat_input(tensor).numpy()
        n, b = x.size, self.group
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, param=b)
        packed = payload.sections[0].numpy()
        scales = payload.sections[1].numpy()
        inv = block_scales(x, b, LEVELS, scales)
        q = np.empty(n + (n & 1), dtype=np.float32)
        per_element = np.repeat(inv, b)[:n] if b > 1 else inv
        np.multiply(x, per_element, out=q[:n])
        q[n:] = 0.0
        np.rint(q, out=q)
        np.clip(q, -LEVELS, LEVELS, out=q)  # rounding cannot pass 7, but a NaN scale could: keep to the range
        nib = (q + (LEVELS + 1)).astype(np.uint8)
        np.bitwise_or(nib[0::2], np.left_shift(nib[1::2], 4), out=packed)
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        group = max(1, int(param))
        return [(torch.uint8, (numel + 1) // 2), (torch.float32, (numel + group - 1) // group)]

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        out = output_for(payload, out)
        packed = payload.sections[0].numpy()
        scales = payload.sections[1].numpy()
        b = max(1, payload.param)

        def fill(flat: torch.Tensor) -> None:
            f = flat.numpy()
            n = f.size
            q = np.empty(2 * packed.size, dtype=np.int8)
            np.bitwise_and(packed, 0x0F, out=q[0::2], casting="unsafe")
            np.right_shift(packed, 4, out=q[1::2], casting="unsafe")
            q -= LEVELS + 1
            per_element = np.repeat(scales, b)[:n] if b > 1 else scales
            np.multiply(q[:n], per_element, out=f, casting="unsafe")
        return decode_into(out, fill)

    def __repr__(self) -> str:
        return f"Int4(group={self.group})"
