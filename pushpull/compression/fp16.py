"""Half-precision cast: halves the bytes of fp32 gradients, keeps the dense shape."""

from __future__ import annotations

import torch

from .base import Codec, Payload, flat_input, output_for, register_codec


@register_codec
class FP16(Codec):
    """Cast to float16 for the wire and back to the original dtype on arrival."""

    codec = 1
    name = "fp16"

    def compress(self, tensor: torch.Tensor) -> Payload:
        src = flat_input(tensor, compute_dtype=None)
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape)
        payload.sections[0].copy_(src)  # the cast happens inside the copy
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        return [(torch.float16, numel)]

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        out = output_for(payload, out)
        out.view(-1).copy_(payload.sections[0])
        return out
