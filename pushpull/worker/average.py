"""The average stage: every place a worker turns a server's sum into a mean, in one class.

Why on arrival where it can: NumPy scales a float partition while copying it out of the message (one pass
over the data instead of two); dtypes NumPy cannot scale in place (bfloat16) and integers are divided at
the end, per tensor. The sum is divided by size (Horovod's average: the sum divided by the count, not
multiplied by 1/size, which is one rounding away at 3 workers), or by the pushes summed for a backup
worker's round that completed without some ranks.
"""
from __future__ import annotations

import numpy as np

from pushpull import dtypes
from pushpull.worker.table import Entry, Partition

# dtypes NumPy can average in place as they arrive, by name (bfloat16 has no NumPy type)
NP_FLOAT = {d.name: d.np_native for d in dtypes.DTYPES
            if d.floating and d.np_native is not None and d.header is not None}


class Averager:
    """Averages over ``size`` workers (:meth:`resize` when the workers change)."""

    __slots__ = ("size", "inv")

    def __init__(self, size: int):
        self.size = size
        self.inv = 1.0 / size

    def resize(self, size: int) -> None:
        self.size = size
        self.inv = 1.0 / size

    def _count(self, inv: float | None) -> int:
        """The divisor: size, or the pushes a backup round summed (handed in as ``inv`` = 1/count)."""
        return self.size if inv is None else round(1.0 / inv)

    def copy_sum(self, e: Entry, p: Partition, buf, dst: np.ndarray, average: bool,
                 inv: float | None = None) -> str | None:
        """Copy a partition's sum from the server into ``dst`` (averaging floats on the way: divided by size,
        or by the pushes summed with backup workers, ``inv`` = 1/that); an error text when the server's answer
        does not fit."""
        if len(buf) != p.nbytes:
            return f"tensor {e.name!r}: server {p.server} answered {len(buf)} bytes for a partition of {p.nbytes}"
        npdt = NP_FLOAT.get(e.dtype.name) if average and self.size > 1 else None
        if npdt is not None:  # average while copying: one pass over the data instead of two
            np.divide(np.frombuffer(buf, dtype=npdt), npdt(self._count(inv)), out=dst.view(npdt))
        else:
            np.copyto(dst, np.frombuffer(buf, dtype=np.uint8))
        return None

    def scale(self, dst: np.ndarray, dtype: dtypes.DType, average: bool, inv: float | None = None) -> None:
        """A decompressed partition, in place (divided by size, or by the pushes summed with backup workers)."""
        npdt = NP_FLOAT.get(dtype.name) if average and self.size > 1 else None
        if npdt is not None:
            typed = dst.view(npdt)
            np.divide(typed, npdt(self._count(inv)), out=typed)

    def finish(self, out: np.ndarray, dtype: dtypes.DType, average: bool, counts: list | None = None) -> None:
        """Average what was not averaged on arrival (dtypes NumPy cannot scale in place), in ``out``, the
        result's bytes; integers are divided rounding toward zero, as C integer division. ``counts``: backup
        workers' partitions, each divided by the pushes its sum holds."""
        if counts:
            for off, nbytes, count in counts:
                _divide(out[off:off + nbytes], dtype, count)
            return
        if average and self.size > 1 and dtype.name not in NP_FLOAT:
            _divide(out, dtype, self.size)


def _divide(raw: np.ndarray, dtype: dtypes.DType, count: int) -> None:
    """``raw`` (bytes of ``dtype``) divided by ``count`` in place: floats rounded as the dtype rounds, bfloat16
    through float32 and back rounding to nearest even (as torch does), integers toward zero."""
    typed = raw.view(dtype.np_wire)
    if dtype.name == "bfloat16":
        wide = dtypes.widen_bf16(typed) / np.float32(count)
        bits = wide.view(np.uint32)
        nan = np.isnan(wide)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        bits[nan] = (wide.view(np.uint32)[nan] >> 16) | 0x40  # a NaN stays a (quiet) NaN
        typed[...] = bits.astype(np.uint16)
    elif dtype.name == "float16":  # in float32, rounded once: a count over 2048 is not a float16
        typed[...] = (typed.astype(np.float32) / np.float32(count)).astype(np.float16)
    elif dtype.floating:
        np.divide(typed, typed.dtype.type(count), out=typed)
    else:  # in int64: a count of 128 workers or more is not an int8
        wide = typed.astype(np.int64)
        q, r = np.divmod(wide, np.int64(count))
        q[(r != 0) & (wide < 0)] += 1  # floor to trunc: a negative quotient with a remainder rounds up
        typed[...] = q.astype(typed.dtype)
