"""1-bit sign compression (signSGD with an optional mean-magnitude scale)."""

from __future__ import annotations

import numpy as np
import torch

from .base import CHUNK, Codec, Option, Payload, decode_into, flat_input, lut_decode, output_for, register_codec

_FLAG_SCALING = 1

# Row b holds the eight sign flags of byte b, least significant bit first.
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(bool)


def _check_scaling(v) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"compression spec: scaling must be true or false, got {v!r}")


@register_codec
class OneBit(Codec):
    """Sign bits packed 32 per little-endian word (bit set = negative: x < 0) plus one scale.

    The sign is BytePS's: ``x < 0`` is negative, so -0.0 (and NaN) decode to +scale. Taking the IEEE sign
    bit instead would send -0.0 as negative: one bit cheaper to think about, but it disagrees with BytePS's
    reference on every -0.0 (fp16 gradients have many), and no user gains from a signed zero's sign.

    With ``scaling`` the scale is mean(|x|), which keeps the decoded tensor's
    L1 norm equal to the input's; without it every element decodes to +-1.
    """

    codec = 2
    name = "onebit"
    options = {"scaling": Option(True, _check_scaling, "scale = mean(|x|) (true) or 1 (false)")}

    def __init__(self, scaling: bool = True):
        self.scaling = bool(scaling)
        self._flags = np.empty(CHUNK, dtype=bool)
        self._mags = np.empty(CHUNK, dtype=np.float32)

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = flat_input(tensor)
        n = x.numel()
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape,
                                   flags=_FLAG_SCALING if self.scaling else 0)
        packed = payload.sections[0].numpy().view(np.uint8)
        xs = x.numpy()
        flags, mags = self._flags, self._mags
        abs_sum = 0.0  # per-chunk fp32 sums added in double: fp32 over 64M elements drifts
        for start in range(0, n, CHUNK):  # CHUNK is a multiple of 8: chunks start on byte boundaries
            chunk = xs[start:start + CHUNK]
            f = flags[: chunk.size]
            np.less(chunk, 0, out=f)  # BytePS's sign: -0.0 and NaN are not negative
            bits = np.packbits(f, bitorder="little")
            packed[start // 8: start // 8 + bits.size] = bits
            if self.scaling:
                m = mags[: chunk.size]
                np.abs(chunk, out=m)
                abs_sum += float(m.sum())
        packed[(n + 7) // 8:] = 0  # padding up to the last whole word
        payload.set_scale((abs_sum / n if n else 0.0) if self.scaling else 1.0)
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        return [(torch.int32, (numel + 31) // 32)]

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        out = output_for(payload, out)
        table = np.where(_BYTE_BITS, np.float32(-payload.scale), np.float32(payload.scale))
        packed = payload.sections[0].numpy().view(np.uint8)
        return decode_into(out, lambda flat: lut_decode(packed, table, flat.numpy()))

    def __repr__(self) -> str:
        return f"OneBit(scaling={self.scaling})"
