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


class NumpyKind:
    """NumPy arrays (and anything ``np.asarray`` takes without a copy is not assumed): host memory only."""

    name = "numpy"

    @staticmethod
    def accepts(x) -> bool:
        return isinstance(x, np.ndarray)

    @staticmethod
    def dtype(x) -> DType:
        d = dtypes.BY_NAME.get(x.dtype.name)
        if d is None or d.header is None:
            raise TypeError(f"dtype {x.dtype.name} is not supported; use one of {', '.join(dtypes.TENSOR_NAMES)}")
        return d

    @staticmethod
    def shape(x) -> tuple:
        return tuple(x.shape)

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
        np.copyto(dst, src.reshape(dst.shape), casting="no")

    @staticmethod
    def to_device(x, device):
        return x


class TorchKind:
    """torch tensors: any device (a CUDA tensor is staged through host memory and its result copied back)."""

    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.table = dtypes.torch_table()

    def accepts(self, x) -> bool:
        return isinstance(x, self.torch.Tensor)

    def dtype(self, x) -> DType:
        d = self.table.get(x.dtype)
        if d is None or d.header is None:
            raise TypeError(f"dtype {x.dtype} is not supported; use one of {', '.join(dtypes.TENSOR_NAMES)}")
        return d

    @staticmethod
    def shape(x) -> tuple:
        return tuple(x.shape)

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
        if x.dtype is not self.torch.bfloat16:
            return x.numpy().reshape(-1).view(np.uint8)
        return x.reshape(-1).view(self.torch.uint8).numpy()

    def payload(self, x, d: DType):
        return x.numpy() if d.np_native is not None else self.raw(x)

    def empty(self, shape: tuple, d: DType):
        return self.torch.empty(shape, dtype=d.torch)

    def zeros(self, shape: tuple, d: DType):
        return self.torch.zeros(shape, dtype=d.torch)

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
_torch_kind: TorchKind | None = None


def kind_of(x, what: str = "tensor"):
    """The kind of ``x``; a TypeError names what was passed where neither kind fits."""
    if isinstance(x, np.ndarray):
        return NUMPY
    global _torch_kind
    if "torch" in sys.modules:  # a torch tensor can exist only once torch is imported
        if _torch_kind is None:
            _torch_kind = TorchKind()
        if _torch_kind.accepts(x):
            return _torch_kind
    raise TypeError(f"{what} must be a torch.Tensor or a NumPy array, got {type(x).__name__}")


def describe(x) -> str:
    """``float32[3,4]``: what an unnamed call moves, for its key (the same text for both kinds)."""
    name = x.dtype.name if isinstance(x, np.ndarray) else str(x.dtype).replace("torch.", "")
    return f"{name}[{','.join(map(str, x.shape))}]"
