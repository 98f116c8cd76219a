"""``Compression.none`` / ``Compression.fp16`` as in Horovod and BytePS, any compressor of
:mod:`pushpull.compression` by spec, and Horovod-style compressors of your own: the ``compression``
argument of every binding (``pushpull.torch``, ``pushpull.tensorflow``, ``pushpull.keras``, ``pushpull.mxnet``
re-export it), so it needs no framework.

Two kinds of compressor:

* *wire* compressors (``Compression.none``, ``Compression.fp16``, ``Compression.build(...)``) carry a
  JSON-able ``spec``: the worker compresses each partition before the push and the server decompresses,
  sums and compresses the sum again (BytePS semantics), so the spec travels to the server in the INIT.
* Horovod's interface: a class (or object) with ``compress(tensor) -> (tensor, ctx)`` and
  ``decompress(tensor, ctx) -> tensor``, usually a subclass of :class:`Compressor` with static methods.
  These run on the worker around the reduction, so the servers reduce the compressed tensors (Horovod's
  semantics: the compressed tensor must have a dtype the servers can sum).
"""
from __future__ import annotations

import numpy as np


class Compressor:
    """Horovod's compressor interface. Subclass it and override the two static methods to compress on the
    worker; instances built from a ``spec`` are pushpull's wire compressors."""

    spec: dict | None = None
    wire = False  # True: the engine and the servers apply ``spec``; compress/decompress are not called

    def __init__(self, spec: dict | None, name: str):
        self.spec = spec
        self.name = name
        self.wire = True

    def __repr__(self) -> str:
        return f"Compression.{self.name}"

    @staticmethod
    def compress(tensor):
        """Returns the tensor to reduce and a context for :meth:`decompress`."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16(Compressor):
    """Wire fp16 (the servers sum in fp32); called directly it casts as Horovod's FP16Compressor does."""

    @staticmethod
    def compress(tensor):
        if isinstance(tensor, np.ndarray):
            return (tensor.astype(np.float16), tensor.dtype) if tensor.dtype.kind == "f" else (tensor, tensor.dtype)
        if tensor.dtype.is_floating_point:
            import torch

            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if isinstance(tensor, np.ndarray):
            return tensor.astype(ctx) if ctx is not None and np.dtype(ctx).kind == "f" else tensor
        return tensor.to(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """Namespace of ready-made compressions (Horovod-compatible names)."""

    Compressor = Compressor
    none = Compressor(None, "none")
    fp16 = _FP16({"compressor": "fp16"}, "fp16")

    @staticmethod
    def build(compressor: str, **kwargs) -> Compressor:
        """Any registered compressor, e.g. ``Compression.build("onebit", scaling=True, ef="vanilla")``."""
        spec = {"compressor": compressor, **kwargs}
        try:  # validate now, where the user can see the culprit
            from pushpull.compression import build
        except ModuleNotFoundError as ex:
            if ex.name != "torch":
                raise
        else:  # without torch the engine refuses it at first use, saying so
            build(spec)
        return Compressor(spec, compressor)


def normalize(compression, what: str = "") -> Compressor | None:
    """The ``compression`` argument in any of its forms, turned once, at the API edge, into the one object
    every layer below takes: None (no compression), a wire :class:`Compressor` (its ``spec`` travels to the
    engine and the servers), or a Horovod-style compressor (``compress``/``decompress`` around the reduction).

    Forms: None or ``Compression.none``; a codec's name (``"onebit"``); a spec dict (BytePS's
    ``compression_params``, ``{"compressor": "topk", "k": 0.01}``); ``Compression.fp16`` or
    ``Compression.build(...)``; a Horovod-style class or object. ``what`` names the call for the error
    (``push_pull of 'fc.weight'``), which names the compressor too."""
    if not what:
        return _normalize(compression)
    try:
        return _normalize(compression)
    except (ValueError, TypeError) as ex:
        raise type(ex)(f"{what}: bad compression {compression!r}: {ex}") from None


def _normalize(compression) -> Compressor | None:
    if compression is None or compression is Compression.none:
        return None
    if isinstance(compression, str):
        return Compression.build(compression)
    if isinstance(compression, dict):
        if not compression:
            return None
        spec = dict(compression)  # no compressor named: "none" (a momentum or error feedback alone)
        return Compression.build(spec.pop("compressor", "none"), **spec)
    if getattr(compression, "wire", False):
        return compression if compression.spec else None
    if callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None)):
        return compression
    raise TypeError(f"compression={compression!r} is neither a pushpull compression (Compression.none, "
                    f"Compression.fp16, Compression.build(...), a codec's name or spec dict) nor a Horovod-style "
                    f"compressor with compress(tensor) -> (tensor, ctx) and decompress(tensor, ctx) -> tensor")
