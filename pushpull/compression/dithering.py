"""Stochastic quantisation to s levels (QSGD-style dithering), unbiased."""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import CHUNK, SEED, Codec, Option, Payload, decode_into, flat_input, lut_decode, make_rng, output_for, register_codec

PARTITIONS = ("linear", "natural")
NORMALIZATIONS = ("max", "l2")
MAX_LEVELS = 127  # codes 0..2s must fit a byte
DEFAULT_LEVELS = 2


def _choice(key: str, valid: tuple):
    def check(v) -> None:
        if v not in valid:
            raise ValueError(f"compression spec: {key}={v!r} is not valid; choose from {list(valid)}")
    return check

_FLAG_NATURAL = 1
_FLAG_L2 = 2


def code_bits(s: int) -> int:
    """Bits per element for the 2s+1 sign-folded codes, rounded to 2, 4 or 8
    so that a byte always holds whole elements."""
    return 2 if s == 1 else 4 if s <= 7 else 8


def level_values(s: int, natural: bool) -> np.ndarray:
    """Decoded value of each code c in [0, 2s] for scale 1.

    Code c means sign(c - s) * level |c - s|; level q is q/s (linear) or
    2**(q - s) for q >= 1 and 0 for q = 0 (natural: powers of two).
    """
    q = np.arange(-s, s + 1, dtype=np.float64)
    if not natural:
        return q / s
    mag = np.where(q == 0, 0.0, np.exp2(np.abs(q) - s))
    return np.sign(q) * mag


def byte_table(s: int, natural: bool, scale: float) -> np.ndarray:
    """(256, 8 // bits) float32 table: the values packed in each possible byte."""
    bits = code_bits(s)
    per = 8 // bits
    with np.errstate(invalid="ignore"):  # 0 * inf: a non-finite scale decodes to NaN
        values = level_values(s, natural) * scale
    values = np.concatenate([values, np.zeros((1 << bits) - values.size)])  # unused codes
    byte = np.arange(256)[:, None]
    codes = (byte >> (bits * np.arange(per))[None, :]) & ((1 << bits) - 1)
    return values[codes].astype(np.float32)


@register_codec
class Dithering(Codec):
    """Each |x|/scale is rounded at random to one of the two nearest levels,
    with probabilities that make the expectation exact.

    ``k`` is s, the number of non-zero levels. scale is max|x| ("max") or
    ||x||_2 ("l2"). Linear levels are q/s; natural levels are powers of two
    2**(q-s), q = 1..s, finer near zero where most gradient entries are.
    Codes c = s + sign*q in [0, 2s] are bit-packed 2, 4 or 8 bits each.

    Randomness: one 16-bit uniform per element from PCG64, so each rounding
    probability is exact to within 2**-17 (of a level step, on the mean).
    """

    codec = 5
    name = "dithering"
    options = {"k": Option(None, None, f"levels s, a whole number in [1, {MAX_LEVELS}]; default {DEFAULT_LEVELS}"),
               "partition": Option("linear", _choice("partition", PARTITIONS), "linear | natural levels"),
               "normalize": Option("max", _choice("normalize", NORMALIZATIONS), "scale: max | l2"),
               "seed": SEED}

    @classmethod
    def normalize(cls, spec: dict) -> None:
        k = spec["k"]
        if k is None:
            spec["k"] = k = DEFAULT_LEVELS
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k != int(k) \
                or not 1 <= k <= MAX_LEVELS:
            raise ValueError("compression spec: dithering k (levels s) must be a whole number "
                             f"in [1, {MAX_LEVELS}], got {k!r}")
        spec["k"] = int(k)

    def __init__(self, k: int = 2, partition: str = "linear", normalize: str = "max", seed: int | None = None):
        if isinstance(k, bool) or not isinstance(k, (int, float)) or k != int(k) or not 1 <= k <= MAX_LEVELS:
            raise ValueError(f"dithering: k (the number of levels s) must be a whole number in [1, {MAX_LEVELS}], "
                             f"got {k!r}")
        if partition not in PARTITIONS:
            raise ValueError(f"dithering: partition must be one of {PARTITIONS}, got {partition!r}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"dithering: normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        self.s = int(k)
        self.partition = partition
        self.normalize = normalize
        self.seed = seed
        self._rng = make_rng(seed)
        self._bits = code_bits(self.s)
        self._f = np.empty(CHUNK, dtype=np.float32)
        self._g = np.empty(CHUNK, dtype=np.float32)
        self._r = np.empty(CHUNK, dtype=np.int32)
        self._sign = np.empty(CHUNK, dtype=np.int32)
        self._codes = np.empty(CHUNK, dtype=np.uint8)
        self._wide = np.empty(CHUNK, dtype=np.uint32)

    @property
    def k(self) -> int:
        return self.s

    def reset(self) -> None:
        self._rng = make_rng(self.seed)

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = flat_input(tensor)
        n = x.numel()
        xs = x.numpy()
        scale = self._scale(xs)
        natural = self.partition == "natural"
        flags = (_FLAG_NATURAL if natural else 0) | (_FLAG_L2 if self.normalize == "l2" else 0)
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, scale=scale, param=self.s, flags=flags)
        packed = payload.sections[0].numpy()
        per = 8 // self._bits
        if not (scale > 0 and math.isfinite(scale)):
            # All zeros: every element gets the zero code s. With inf/NaN in
            # the input the header's scale makes every decoded value NaN, so
            # the receiver sees the bad step as it would uncompressed.
            zero_byte = sum(self.s << (self._bits * j) for j in range(per))
            packed[:] = zero_byte
            return payload
        kernel = self._natural_codes if natural else self._linear_codes
        for start in range(0, n, CHUNK):
            chunk = xs[start:start + CHUNK]
            m = chunk.size
            codes = self._codes[: m]
            kernel(chunk, codes, scale)
            padded = -(-m // per) * per
            self._codes[m:padded] = self.s  # tail of the last chunk: zero codes
            self._pack(self._codes[:padded], packed[start // per: start // per + padded // per])
        return payload

    def _scale(self, xs: np.ndarray) -> float:
        """max|x| or ||x||_2, chunked; partial sums are added in double."""
        f = self._f
        parts = [0.0]
        for start in range(0, xs.size, CHUNK):
            chunk = xs[start:start + CHUNK]
            tmp = f[: chunk.size]
            if self.normalize == "max":
                np.abs(chunk, out=tmp)
                parts.append(float(tmp.max()))
            else:
                np.square(chunk, out=tmp)
                parts.append(float(tmp.sum()))
        if self.normalize == "max":
            return float(np.max(parts))  # np.max keeps a NaN; Python's max may drop it
        return math.sqrt(math.fsum(parts))

    def _uniform16(self, m: int) -> np.ndarray:
        """m uniform 16-bit integers: a quarter of a 64-bit draw each, the
        cheapest bulk randomness NumPy offers."""
        return self._rng.bit_generator.random_raw((m + 3) // 4).view(np.uint16)[:m]

    def _linear_codes(self, chunk: np.ndarray, codes: np.ndarray, scale: float) -> None:
        """codes = floor(x*s/scale + u) + s with u ~ U[0,1).

        floor(v + u) is an unbiased rounding of v for either sign and has the
        same distribution as sign*(floor|v| + Bernoulli(frac|v|)), so the sign
        needs no separate pass. The offset s keeps codes non-negative, so the
        float->uint8 truncation is the floor.
        """
        m = chunk.size
        s = self.s
        f, g = self._f[:m], self._g[:m]
        np.multiply(self._uniform16(m), np.float32(2.0**-16), out=f)
        np.add(f, np.float32(s + 2.0**-17), out=f)  # midpoints of the 2**16 bins
        np.multiply(chunk, np.float32(s / scale), out=g)
        np.add(f, g, out=f)
        np.copyto(codes, f, casting="unsafe")
        np.minimum(codes, 2 * s, out=codes)  # |x|*s/scale may round just above s

    def _natural_codes(self, chunk: np.ndarray, codes: np.ndarray, scale: float) -> None:
        """Stochastic rounding between adjacent powers of two, on the float bits.

        For v in [2**e, 2**(e+1)) adding a uniform integer below 2**23 to v's
        bit pattern carries into the exponent with probability
        (v - 2**e)/2**e: exactly the unbiased rounding up. Below the smallest
        level t = 2**(1-s) the rounding must be linear between 0 and t; the
        same carry applied to v + t (which lies in [t, 2t)) does that. Both
        are computed for every element with the same random draw and merged
        by clamping, which avoids slow masked NumPy operations:
        q = clip(qv, 1, s) + min(qt, 1) - 1.
        """
        m = chunk.size
        s = self.s
        f, g, r, sign = self._f[:m], self._g[:m], self._r[:m], self._sign[:m]
        np.abs(chunk, out=f)
        np.multiply(f, np.float32(1.0 / scale), out=f)  # v in [0, 1]
        np.add(f, np.float32(2.0 ** (1 - s)), out=g)  # v + t
        np.left_shift(self._uniform16(m), 7, out=r, dtype=np.int32)  # 16 random bits on top of 23
        fv, gv = f.view(np.int32), g.view(np.int32)
        np.add(fv, r, out=fv)
        np.add(gv, r, out=gv)
        np.right_shift(fv, 23, out=fv)  # biased exponents; 127 - s + q encodes level q
        np.right_shift(gv, 23, out=gv)
        np.clip(fv, 128 - s, 127, out=fv)  # qv in [1, s] (v <= 1 up to rounding)
        np.minimum(gv, 129 - s, out=gv)  # qt in {0, 1} below t, 1 above
        np.add(fv, gv, out=fv)
        np.subtract(fv, 256 - 2 * s, out=fv)  # q in [0, s]
        np.right_shift(chunk.view(np.int32), 31, out=sign)  # -1 where x < 0, else 0
        np.bitwise_xor(fv, sign, out=fv)
        np.subtract(fv, sign, out=fv)  # sign * q
        np.add(fv, s, out=fv)
        np.copyto(codes, fv, casting="unsafe")

    def _pack(self, codes: np.ndarray, dest: np.ndarray) -> None:
        """Pack 8/bits codes per byte, first code in the low bits."""
        if self._bits == 8:
            dest[:] = codes
            return
        if self._bits == 4:
            pairs = codes.view(np.uint16)  # little-endian: c0 | c1 << 8
            tmp = self._wide.view(np.uint16)[: pairs.size]
            np.right_shift(pairs, 4, out=tmp)
            np.bitwise_or(tmp, pairs, out=tmp)  # low byte: c0 | c1 << 4
        else:
            quads = codes.view(np.uint32)  # c0 | c1 << 8 | c2 << 16 | c3 << 24
            tmp = self._wide[: quads.size]
            np.right_shift(quads, 6, out=tmp)
            np.bitwise_or(tmp, quads, out=tmp)  # byte 0: c0|c1<<2, byte 2: c2|c3<<2
            np.right_shift(tmp, 12, out=quads)
            np.bitwise_or(tmp, quads, out=tmp)  # byte 0: c0|c1<<2|c2<<4|c3<<6
        np.copyto(dest, tmp, casting="unsafe")  # keep the low byte

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        per = 8 // code_bits(param)
        return [(torch.uint8, -(-numel // per))]

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        out = output_for(payload, out)
        table = byte_table(payload.param, bool(payload.flags & _FLAG_NATURAL), payload.scale)
        packed = payload.sections[0].numpy()
        return decode_into(out, lambda flat: lut_decode(packed, table, flat.numpy()))

    def __repr__(self) -> str:
        return f"Dithering(k={self.s}, partition={self.partition!r}, normalize={self.normalize!r}, seed={self.seed})"
