"""Shared wire format of the sparse codecs: (index, value) pairs."""

from __future__ import annotations

import numpy as np
import torch

from .base import Payload, output_for

INT32_LIMIT = 2**31 - 1


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices whenever they fit: 4 bytes per kept element instead of 8."""
    return torch.int32 if numel <= INT32_LIMIT else torch.int64


def sparse_layout(numel, dtype, param, count, flags):
    """``count`` indices, then ``count`` values in the original dtype."""
    return [(index_dtype(numel), count), (dtype, count)]


def scatter_decode(payload: Payload, out: torch.Tensor | None, accumulate: bool) -> torch.Tensor:
    """Zeros everywhere except the listed entries.

    ``accumulate`` adds repeated indices (random-k draws with replacement)
    instead of letting the last one win. NumPy does the fill and the scatter:
    single-threaded, so it neither fights the caller's threads nor stalls when
    other processes hold the cores (a parallel torch ``zero_`` does both).
    """
    out = output_for(payload, out)
    flat = out.view(-1)
    idx, vals = payload.sections
    if flat.dtype in (torch.float32, torch.float64) and vals.dtype != torch.bfloat16:
        dense = flat.numpy()
        dense.fill(0)
        if payload.count:
            if accumulate:
                np.add.at(dense, idx.numpy(), vals.numpy())
            else:
                dense[idx.numpy()] = vals.numpy()
        return out
    flat.zero_()  # half-precision outputs or bf16 values: NumPy lacks bf16
    if payload.count:
        vals = vals.to(flat.dtype)
        if accumulate:
            flat.index_add_(0, idx, vals)
        else:
            flat.index_copy_(0, idx.to(torch.int64), vals)
    return out
