"""Identity codec: the raw tensor bytes behind the payload header."""

from __future__ import annotations

import torch

from .base import Codec, Payload, _DTYPE_CODE, output_for, register_codec


@register_codec
class NoCompression(Codec):
    """Sends the tensor as is; used below ``min_compress_bytes`` and as the default."""

    codec = 0
    name = "none"

    def compress(self, tensor: torch.Tensor) -> Payload:
        if tensor.dtype not in _DTYPE_CODE:
            raise ValueError(f"dtype {tensor.dtype} cannot be sent")
        src = tensor.detach().cpu().reshape(-1)
        payload = Payload.allocate(self.codec, src.dtype, tensor.shape)
        payload.sections[0].copy_(src)
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        return [(dtype, numel)]

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        # Copy out: the payload may sit on a read-only receive buffer.
        out = output_for(payload, out)
        out.view(-1).copy_(payload.sections[0])
        return out
