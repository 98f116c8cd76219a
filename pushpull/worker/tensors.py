"""The tensor kinds the worker's engine takes: NumPy arrays always, torch tensors when torch is installed.

Why: the engine moves bytes (the wire format knows dtypes, not frameworks), so a framework only has to say
how to read its tensor's bytes, allocate an output and hand it back. Each binding passes its own tensors
(``pushpull.torch`` torch tensors, ``pushpull.tensorflow``, ``pushpull.keras`` and ``pushpull.mxnet`` NumPy
arrays), and a process without torch runs the whole worker. torch is imported only once a torch tensor
arrives (it is then in ``sys.modules`` already), so importing this module costs nothing.
"""
from __future__ import annotations

import sys

import numpy as np

from pushpull import dtypes
from pushpull.dtypes import DType


def _np_dtype(d: DType) -> np.dtype:
    """The NumPy dtype an array of ``d`` is made with: its own, else ml_dtypes' bfloat16 (which TensorFlow
    and JAX install), else the type its bytes are viewed as."""
    if d.np_native is not None:
        return np.dtype(d.np_native)
    try:
        return np.dtype(d.name)
    except TypeError:
        return np.dtype(d.np_wire)


def _unsupported(name: str) -> TypeError:
    return TypeError(f"dtype {name} is not supported; use one of {', '.join(dtypes.TENSOR_NAMES)}")


class _Kind:
    """What both kinds do alike."""

    @staticmethod
    def shape(x) -> tuple:
        return tuple(x.shape)


class NumpyKind(_Kind):
    """NumPy arrays (and anything ``np.asarray`` takes without a copy is not assumed): host memory only."""

    name = "numpy"

    @staticmethod
    def accepts(x) -> bool:
        return isinstance(x, np.ndarray)

    @staticmethod
    def dtype(x) -> DType:
        d = dtypes.BY_NAME.get(x.dtype.name)
        if d is None or d.header is None:
            raise _unsupported(x.dtype.name)
        if not x.dtype.isnative:  # its bytes would be summed as if little-endian
            raise TypeError(f"dtype {x.dtype.str} is not in this machine's byte order; convert it first "
                            f"(array.astype(array.dtype.newbyteorder('=')))")
        return d

    @staticmethod
    def numel(x) -> int:
        return x.size

    @staticmethod
    def on_host(x) -> bool:
        return True

    @staticmethod
    def host(x):
        """(a contiguous host array with the same values, None: NumPy has no device)."""
        return (x if x.flags.c_contiguous else np.ascontiguousarray(x)), None

    @staticmethod
    def raw(x) -> np.ndarray:
        return x.reshape(-1).view(np.uint8)

    @staticmethod
    def payload(x, d: DType):
        return x.reshape(-1) if d.np_native is not None else x.reshape(-1).view(np.uint8)

    @staticmethod
    def empty(shape: tuple, d: DType):
        return np.empty(shape, dtype=_np_dtype(d))

    @staticmethod
    def zeros(shape: tuple, d: DType):
        return np.zeros(shape, dtype=_np_dtype(d))

    @staticmethod
    def empty_like(x):
        """An output like the contiguous host tensor ``x`` (cheaper than :meth:`empty` per call)."""
        return np.empty_like(x)

    @staticmethod
    def detached(x):
        return x

    @staticmethod
    def clone(x):
        return x.copy()

    @staticmethod
    def writable(out) -> bool:
        """The engine may write the result straight into ``out``."""
        return out.flags.c_contiguous and out.flags.writeable

    @staticmethod
    def same_memory(a, b) -> bool:
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]

    @staticmethod
    def copy(dst, src) -> None:
        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")  # as torch's copy_: into dst's dtype

    @staticmethod
    def to_device(x, device):
        return x


class TorchKind(_Kind):
    """torch tensors: any device (a CUDA tensor is staged through host memory and its result copied back)."""

    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.table = dtypes.torch_table()
        self.of_name = {d.name: t for t, d in self.table.items()}  # per call: no lookup through dtypes.get
        self.bfloat16 = torch.bfloat16

    def accepts(self, x) -> bool:
        return isinstance(x, self.torch.Tensor)

    def dtype(self, x) -> DType:
        d = self.table.get(x.dtype)
        if d is None or d.header is None:
            raise _unsupported(str(x.dtype))
        return d

    @staticmethod
    def numel(x) -> int:
        return x.numel()

    @staticmethod
    def on_host(x) -> bool:
        return x.is_cpu

    @staticmethod
    def host(x):
        if x.requires_grad:
            x = x.detach()
        if not x.is_cpu:
            return x.to("cpu").contiguous(), x.device
        return (x if x.is_contiguous() else x.contiguous()), None

    def raw(self, x) -> np.ndarray:
        """A writable uint8 view of a contiguous CPU tensor's memory (through NumPy when it has the dtype:
        half the cost of torch's reshape and view, paid per tensor per step)."""
        if x.dtype is not self.bfloat16:
            return x.numpy().reshape(-1).view(np.uint8)
        return x.reshape(-1).view(self.torch.uint8).numpy()

    def payload(self, x, d: DType):
        return x.numpy() if d.np_native is not None else self.raw(x)

    def empty(self, shape: tuple, d: DType):
        return self.torch.empty(shape, dtype=self.of_name[d.name])

    def zeros(self, shape: tuple, d: DType):
        return self.torch.zeros(shape, dtype=self.of_name[d.name])

    def empty_like(self, x):
        return self.torch.empty_like(x, memory_format=self.torch.contiguous_format)

    @staticmethod
    def detached(x):
        return x.detach()

    @staticmethod
    def clone(x):
        return x.clone()

    @staticmethod
    def writable(out) -> bool:
        return out.device.type == "cpu" and out.is_contiguous()

    @staticmethod
    def same_memory(a, b) -> bool:
        return a.data_ptr() == b.data_ptr()

    @staticmethod
    def copy(dst, src) -> None:
        dst.copy_(src)

    @staticmethod
    def to_device(x, device):
        return x.to(device)


NUMPY = NumpyKind()
_BY_TYPE: dict[type, object] = {np.ndarray: NUMPY}  # a tensor's type -> its kind, learnt on first sight


_torch_kind: TorchKind | None = None


def _torch() -> TorchKind:
    global _torch_kind
    if _torch_kind is None:
        _torch_kind = TorchKind()
    return _torch_kind


def kind_of(x, what: str = "tensor"):
    """The kind of ``x`` (one dict lookup per call once its type was seen: this runs per tensor per step);
    a TypeError names what was passed where neither kind fits."""
    kind = _BY_TYPE.get(type(x))
    if kind is not None:
        return kind
    if isinstance(x, np.ndarray):
        kind = NUMPY
    elif "torch" in sys.modules and _torch().accepts(x):  # a torch tensor exists only once torch is imported
        kind = _torch()
    if kind is None:
        raise TypeError(f"{what} must be a torch.Tensor or a NumPy array, got {type(x).__name__}")
    _BY_TYPE[type(x)] = kind
    return kind


def scaled(arr: np.ndarray, factor: float) -> np.ndarray:
    """``arr * factor`` in ``arr``'s dtype, a new array, rounded as torch rounds it: half precisions through
    float32 (NumPy would round the factor to float16 first), integers truncated back (a prescale of the
    bindings that pass NumPy arrays, the same bits as pushpull.torch's)."""
    if arr.dtype.kind == "f" and arr.dtype.itemsize < 4 or arr.dtype.name == "bfloat16":
        return (arr.astype(np.float32) * np.float32(factor)).astype(arr.dtype)
    return (arr * factor).astype(arr.dtype, copy=False)


def describe(x) -> str:
    """``float32[3,4]``: what an unnamed call moves, for its key (the same text for both kinds)."""
    name = x.dtype.name if isinstance(x, np.ndarray) else str(x.dtype).replace("torch.", "")
    return f"{name}[{','.join(map(str, x.shape))}]"
