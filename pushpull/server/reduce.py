"""Dtype-aware reduction (sum, min, max, product) into an accumulator, in NumPy (the GIL is released
for large arrays, so several engine threads really sum in parallel).

Half-precision pushes are accumulated in float32 and rounded once at the end:
summing n fp16 gradients in fp16 loses bits at every addition. bfloat16 has no
NumPy dtype, so it travels as uint16 and is widened by a shift.
"""
from __future__ import annotations

import numpy as np

from pushpull import dtypes

# what a push's bytes are viewed as, and what a round is accumulated in (pushpull.dtypes)
WIRE_NP = {d.name: d.np_wire for d in dtypes.DTYPES if d.header is not None}
ACC_NP = {d.name: d.np_acc for d in dtypes.DTYPES if d.header is not None}


def wire_view(buf, dtype: str) -> np.ndarray:
    return np.frombuffer(buf, dtype=WIRE_NP[dtype])


def bf16_to_f32(u16: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    f = dtypes.widen_bf16(u16)
    if out is None:
        return f
    np.copyto(out, f)
    return out


def f32_to_bf16(f: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = f.view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def to_wire(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` (in the accumulation dtype) as the wire carries ``dtype`` (bfloat16: its bits, rounded)."""
    if dtype == "bfloat16":
        return f32_to_bf16(np.ascontiguousarray(a, dtype=np.float32))
    return a.astype(WIRE_NP[dtype])


_UFUNC = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}


class Accumulator:
    """The reduction of the pushes of one round for one key: a sum (or min, max, product: ``op``).

    When the result keeps the wire dtype, the first push is only remembered (a
    view of the received frame) and the second is combined with it straight into
    the accumulator: one pass over the data fewer than copying the first push
    in. With one worker the first push is the result.
    """

    def __init__(self, dtype: str, numel: int, op: str = "sum", out: np.ndarray | None = None):
        """``out``: where to accumulate (a shared-memory output, in the accumulation dtype), else new memory."""
        self.dtype = dtype
        self.acc = out if out is not None else np.empty(numel, dtype=ACC_NP[dtype])
        self._same = ACC_NP[dtype] is WIRE_NP[dtype]
        self._held: np.ndarray | None = None  # the first push, not yet combined
        self._ufunc = _UFUNC[op]

    def first(self, data: np.ndarray) -> None:
        self._held = data if self._same else None
        if self._same:
            return
        if self.dtype == "bfloat16":
            bf16_to_f32(data, out=self.acc)
        else:
            np.copyto(self.acc, data, casting="unsafe")

    def add(self, data: np.ndarray) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._ufunc(held, data, out=self.acc, casting="unsafe")
        elif self.dtype == "bfloat16":
            self._ufunc(self.acc, bf16_to_f32(data), out=self.acc)
        else:
            self._ufunc(self.acc, data, out=self.acc, casting="unsafe")

    def total(self) -> np.ndarray:
        """The result in the accumulation dtype (an outer step takes it unrounded; for bfloat16 the wire's
        dtype is its bits)."""
        return self._held if self._held is not None else self.acc

    def result(self) -> np.ndarray:
        """The result in the wire dtype (shares memory with the accumulator, or with the
        only push, when it can)."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        if self.dtype == "bfloat16":
            return f32_to_bf16(self.acc)
        if self.dtype == "float16":
            return self.acc.astype(np.float16)
        return self.acc


class Concat:
    """A concat key's round: each rank writes its bytes at the offset it was given (allgather,
    alltoall); the workers agreed the offsets before, so the slices do not overlap."""

    def __init__(self, numel: int):
        self.acc = np.zeros(numel, dtype=np.uint8)

    def put(self, data: np.ndarray, offset: int) -> None:
        self.acc[offset:offset + len(data)] = data

    def result(self) -> np.ndarray:
        return self.acc
