"""The average stage: every place a worker turns a server's sum into a mean, in one class.

Why on arrival where it can: NumPy scales a float partition while copying it out of the message (one pass
over the data instead of two); dtypes NumPy cannot scale in place (bfloat16) and integers are divided at
the end, per tensor. The sum is divided by size (Horovod's average: the sum divided by the count, not
multiplied by 1/size, which is one rounding away at 3 workers), or by the pushes summed for a backup
worker's round that completed without some ranks.
"""
from __future__ import annotations

import numpy as np
import torch

from pushpull import dtypes
from pushpull.worker.table import DTYPE_NAME, Entry, Partition

# dtypes NumPy can average in place as they arrive (bfloat16 has no NumPy type)
NP_FLOAT = {t: dtypes.BY_NAME[n].np_native for t, n in DTYPE_NAME.items()
            if dtypes.BY_NAME[n].floating and dtypes.BY_NAME[n].np_native is not None}


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
        npdt = NP_FLOAT.get(e.dtype) if average and self.size > 1 else None
        if npdt is not None:  # average while copying: one pass over the data instead of two
            np.divide(np.frombuffer(buf, dtype=npdt), npdt(self._count(inv)), out=dst.view(npdt))
        else:
            np.copyto(dst, np.frombuffer(buf, dtype=np.uint8))
        return None

    def scale(self, dst: np.ndarray, dtype: torch.dtype, average: bool, inv: float | None = None) -> None:
        """A decompressed partition, in place (divided by size, or by the pushes summed with backup workers)."""
        npdt = NP_FLOAT.get(dtype) if average and self.size > 1 else None
        if npdt is not None:
            typed = dst.view(npdt)
            np.divide(typed, npdt(self._count(inv)), out=typed)

    def finish(self, out: torch.Tensor, average: bool, counts: list | None = None) -> None:
        """Average what was not averaged on arrival (dtypes NumPy cannot scale in place); integers are
        divided rounding toward zero, as C integer division. ``counts``: backup workers' partitions, each
        divided by the pushes its sum holds."""
        if counts:
            flat = out.reshape(-1).view(torch.uint8)
            for off, nbytes, count in counts:
                part = flat[off:off + nbytes].view(out.dtype)
                if out.dtype.is_floating_point:
                    part.div_(count)
                else:
                    part.copy_(torch.div(part, count, rounding_mode="trunc"))
            return
        if average and self.size > 1 and out.dtype not in NP_FLOAT:
            if out.dtype.is_floating_point:
                out.div_(self.size)
            else:
                out.copy_(torch.div(out, self.size, rounding_mode="trunc"))
