"""MXNet collectives over pushpull's parameter servers (``import pushpull.mxnet as bps``).

A thin adapter over the framework-neutral job context (one engine per process,
:mod:`pushpull.worker.context`; torch is not needed): an NDArray crosses as
``asnumpy()`` and the result is written back with ``nd[:] = ...``. ``asnumpy()`` waits for that array only:
MXNet computes asynchronously on its own engine threads, so while this thread
waits for one gradient and pushes it, the earlier layers' gradients are still
being computed. Starting the pushes last layer first therefore sends each
gradient as soon as MXNet has it, the only hook MXNet 1.x offers from Python.
"""
from __future__ import annotations

import itertools

import mxnet as mx
import numpy as np

from pushpull.worker import broadcast as _bc
from pushpull.worker.compression import Compression  # noqa: F401
from pushpull.worker.tensors import scaled
from pushpull.worker.context import (  # noqa: F401 - Horovod's names
    CONTEXT as _ctx, barrier, distributed, init, is_initialized, local_rank, local_size, rank, shutdown, size,
)

_REDUCIBLE = {np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8}


def _host(nd) -> np.ndarray:
    return np.ascontiguousarray(nd.asnumpy())  # a fresh host copy: writable, ours


def _check(nd, name: str) -> None:
    if not isinstance(nd, mx.nd.NDArray):
        raise TypeError(f"{name}: expected an mxnet NDArray, got {type(nd).__name__}")
    if nd.stype != "default":
        raise TypeError(f"{name}: sparse NDArrays ({nd.stype}) are not supported; the servers sum dense arrays")
    if np.dtype(nd.dtype).type not in _REDUCIBLE:
        raise TypeError(f"{name}: dtype {np.dtype(nd.dtype).name} cannot be summed on the servers")


def start(nd, name: str, average: bool, priority: int = 0, compression=None, prescale: float = 1.0) -> int:
    """Start reducing ``nd`` (waits for MXNet to have computed it); returns a pushpull handle."""
    _check(nd, name)
    arr = _host(nd)
    if prescale != 1.0:
        arr = scaled(arr, prescale)
    return _ctx.push_pull_async(arr, arr, average, name, priority, compression)


def finish(handle: int, outs, postscale: float = 1.0) -> None:
    """Wait for ``handle`` and write the result into each NDArray of ``outs``."""
    res = np.asarray(_ctx.synchronize(handle))
    if postscale != 1.0:
        res = scaled(res, postscale)
    for o in outs:
        o[:] = mx.nd.array(res, ctx=o.context, dtype=o.dtype)


def reduce_many(items, average: bool, compression=None, prescale: float = 1.0, postscale: float = 1.0) -> None:
    """``items``: ``(name, priority, source NDArray, [output NDArrays])``. Started in ascending
    priority (last layer first when priorities are minus the forward index), then all waited for."""
    items = sorted(items, key=lambda it: it[1])
    handles = [(start(src, name, average, prio, compression, prescale), outs)
               for name, prio, src, outs in items]
    err = None
    for h, outs in handles:  # wait for all, even after a failure, so no handle is left behind
        try:
            finish(h, outs, postscale)
        except Exception as e:  # noqa: BLE001
            err = err or e
    if err is not None:
        raise err


_unnamed = itertools.count()


def allreduce_(tensor, average: bool = True, name: str | None = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, compression=None):
    """Horovod's ``allreduce_``: average (or sum) over all workers, in place; returns ``tensor``."""
    _ctx.need_init()
    name = "mx." + (name or f"allreduce.noname.{next(_unnamed)}")
    if not distributed():
        if prescale_factor * postscale_factor != 1.0:
            tensor *= prescale_factor * postscale_factor
        return tensor
    reduce_many([(name, priority, tensor, [tensor])], average, compression, prescale_factor, postscale_factor)
    return tensor


def allreduce(tensor, average: bool = True, name: str | None = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, compression=None):
    """Horovod's ``allreduce``: a new NDArray with the average (or sum) over all workers."""
    return allreduce_(tensor.copy(), average, name, priority, prescale_factor, postscale_factor, compression)


def byteps_push_pull(tensor, version: int = 0, priority: int = 0, name: str | None = None,
                     is_average: bool = True) -> None:
    """BytePS's in-place ``byteps_push_pull`` (sum, or average with ``is_average``)."""
    allreduce_(tensor, average=is_average, name=name, priority=priority)


push_pull = byteps_push_pull


def byteps_declare_tensor(name: str, **kwargs) -> None:
    """BytePS's declaration: keys are agreed by name here, so declaring is optional and a no-op."""
    _ctx.need_init()


def broadcast_(tensor, root_rank: int, name: str | None = None):
    """``root_rank``'s value written into ``tensor`` on every rank, bit-exact; returns ``tensor``."""
    _ctx.need_init()
    _bc.check_root(root_rank)
    if distributed():
        got = _bc.broadcast_arrays([("mx.bcast." + (name or f"noname.{next(_unnamed)}"), _host(tensor))],
                                   root_rank)[0]
        tensor[:] = mx.nd.array(got, ctx=tensor.context, dtype=tensor.dtype)
    return tensor


def broadcast(tensor, root_rank: int, name: str | None = None):
    return broadcast_(tensor.copy(), root_rank, name)


def _param_items(params):
    """(name, NDArray list) pairs from a ParameterDict / dict of Parameters / dict of NDArrays."""
    items = params.items() if hasattr(params, "items") else params
    out = []
    for name, p in sorted(items, key=lambda kv: str(kv[0])):
        if isinstance(p, mx.gluon.Parameter):
            if p._deferred_init:
                raise ValueError(f"broadcast_parameters: parameter {name!r} is not initialized yet (deferred "
                                 f"shape inference): run one forward pass first, or let DistributedTrainer "
                                 f"broadcast at its first step")
            out.append((str(name), p.list_data()))
        elif isinstance(p, mx.nd.NDArray):
            out.append((str(name), [p]))
        else:
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(p).__name__}")
    return out


def broadcast_parameters(params, root_rank: int = 0, prefix: str = "mx.params.") -> None:
    """Set every rank's parameters to ``root_rank``'s, in place (Horovod/BytePS); every rank first checks
    that all ranks hold the same set (names, dtypes, shapes), or all raise naming who differs."""
    _ctx.need_init()
    _bc.check_root(root_rank)
    items = _param_items(params)
    if not distributed() or not items:
        return
    got = _bc.broadcast_checked([(name, _host(arrays[0])) for name, arrays in items], root_rank, prefix)
    for (name, arrays), value in zip(items, got):
        for a in arrays:
            a[:] = mx.nd.array(value, ctx=a.context, dtype=a.dtype)


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, allow_pickle: bool | None = None):
    _ctx.need_init()
    return _bc.broadcast_object(obj, root_rank, name=name and "mx." + name, allow_pickle=allow_pickle)
