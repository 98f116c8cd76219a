"""One table of the element types pushpull knows: name, item size, NumPy and torch types, and the id each
has in the three places an id travels.

Why one table: seven modules each kept their own (the engine, the protocol, the compression payload, the
server's reduction and codec, the all-reduce backend, the profiles), with three numberings, and a dtype
added to one was silently missing from the others. The numberings stay as they are on the wire today:

* ``header``: the dtype field of a message header (:mod:`pushpull.transport.protocol`); the dtypes a
  push_pull can carry are exactly those that have one.
* ``payload``: the dtype byte of a compression payload (:mod:`pushpull.compression.base`).
* ``sig``: the dtype field of a round signature (a broadcast's dtype, checked across ranks), 1-based.

This module imports NumPy only (the simulator and the server's reduction use it without torch); the torch
types are looked up on first use.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str                   # torch's name without "torch." (and the name in profiles and INITs)
    itemsize: int               # bytes per element
    floating: bool
    np_wire: type | None        # the NumPy type its bytes are viewed as (bfloat16: uint16, no NumPy type)
    np_native: type | None      # the NumPy type with the same values (None: NumPy has none)
    header: int | None          # id in a message header; None = cannot be pushed as a tensor
    payload: int | None         # id in a compression payload; None = cannot be compressed or carried there
    sig: int                    # id in a round signature (1-based; 31 = unknown)

    @property
    def np_acc(self) -> type | None:
        """What a server accumulates it in: half precisions in float32 (rounded once at the end)."""
        return np.float32 if self.name in ("float16", "bfloat16") else self.np_wire

    @property
    def torch(self):
        return to_torch(self.name)


def _d(name, itemsize, floating, np_wire, np_native, header, payload, sig) -> DType:
    return DType(name, itemsize, floating, np_wire, np_native, header, payload, sig)


DTYPES: tuple[DType, ...] = (
    #   name          size  float  wire view    native       header payload sig
    _d("uint8",       1,   False, np.uint8,    np.uint8,     0,     8,      9),
    _d("float16",     2,   True,  np.float16,  np.float16,   1,     1,      1),
    _d("bfloat16",    2,   True,  np.uint16,   None,         2,     2,      2),
    _d("float32",     4,   True,  np.float32,  np.float32,   3,     0,      3),
    _d("float64",     8,   True,  np.float64,  np.float64,   4,     3,      4),
    _d("int32",       4,   False, np.int32,    np.int32,     5,     5,      7),
    _d("int64",       8,   False, np.int64,    np.int64,     6,     4,      8),
    _d("int8",        1,   False, np.int8,     np.int8,      7,     7,      5),
    _d("int16",       2,   False, np.int16,    np.int16,     8,     6,      6),
    _d("bool",        1,   False, np.bool_,    np.bool_,     None,  9,      10),
    _d("complex64",   8,   False, np.complex64, np.complex64, None, None,   11),
    _d("complex128",  16,  False, np.complex128, np.complex128, None, None, 12),
)
SIG_UNKNOWN = 31

BY_NAME: dict[str, DType] = {d.name: d for d in DTYPES}
BY_HEADER: dict[int, DType] = {d.header: d for d in DTYPES if d.header is not None}
BY_PAYLOAD: dict[int, DType] = {d.payload: d for d in DTYPES if d.payload is not None}
BY_SIG: dict[int, DType] = {d.sig: d for d in DTYPES}

TENSOR_NAMES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.header is not None)  # push_pull carries these
FLOAT_NAMES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.floating)
NBYTES: dict[str, int] = {d.name: d.itemsize for d in DTYPES}
SIG_NAMES: tuple[str, ...] = tuple(BY_SIG[i].name for i in sorted(BY_SIG))  # in id order: id = index + 1


def get(name: str) -> DType:
    """The dtype called ``name`` (``float32`` or ``torch.float32``); the error lists the known ones."""
    try:
        return BY_NAME[name.replace("torch.", "")]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(BY_NAME)}") from None


def itemsize(name: str) -> int:
    return get(name).itemsize


def widen_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values (their uint16 bits) as float32, exactly (a new array): bfloat16 is float32's top half."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------------------------------------ torch --

@lru_cache(maxsize=None)
def _torch_maps() -> tuple[dict, dict]:
    import torch

    to = {d.name: getattr(torch, d.name) for d in DTYPES}
    return to, {t: BY_NAME[n] for n, t in to.items()}


def to_torch(name: str):
    """``"float32"`` -> ``torch.float32``."""
    return _torch_maps()[0][get(name).name]


def torch_table() -> dict:
    """``{torch.dtype: DType}`` for every dtype in the table (a dict: one lookup on hot paths)."""
    return _torch_maps()[1]


def of_torch(dtype) -> DType:
    """The entry of a torch dtype; a ValueError names it when pushpull does not know it."""
    try:
        return _torch_maps()[1][dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported; known: {', '.join(BY_NAME)}") from None
