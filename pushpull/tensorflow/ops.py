"""TensorFlow collectives over pushpull's parameter servers (``import pushpull.tensorflow as bps``).

The binding is a thin adapter over the framework-neutral job context
(:mod:`pushpull.worker.context`): a TensorFlow tensor crosses into the engine
as a NumPy array and comes back as one; torch is not needed. One engine per
process serves every binding, so a script may mix them.

Eagerly, a reduction runs in Python directly. Inside a ``tf.function`` it
becomes two kinds of ``tf.py_function`` op: one *start* op per tensor, which
depends on that tensor only, so TensorFlow's executor runs it (and the push
leaves) as soon as that gradient is computed while the rest of the backward
pass goes on, and one *wait* op that depends on all the starts. XLA cannot
compile ``py_function``: with ``jit_compile=True`` these calls raise a clear
error instead of failing deep inside XLA.
"""
from __future__ import annotations

import itertools
import logging

import numpy as np
import tensorflow as tf

from pushpull.worker import broadcast as _bc
from pushpull.worker.compression import Compression, normalize
from pushpull.worker.tensors import scaled
from pushpull.worker.context import (  # noqa: F401 - Horovod's names
    CONTEXT as _ctx, barrier, distributed, init, is_initialized, local_rank, local_size, rank, shutdown, size,
)

log = logging.getLogger("pushpull.tensorflow")

class ReduceOp(int):
    """Horovod's reduction operators. This binding reduces with Average (the sum divided by size()) and Sum."""

    _names = {0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product"}

    def __repr__(self) -> str:
        return self._names.get(int(self), f"ReduceOp({int(self)})")


Average = ReduceOp(0)
Sum = ReduceOp(1)
Adasum = ReduceOp(2)
Min = ReduceOp(3)
Max = ReduceOp(4)
Product = ReduceOp(5)

# TF dtypes the servers can sum (bool, complex and strings cannot be reduced; they can be broadcast)
_REDUCIBLE = {tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8}


def _average_of(average: bool | None, op) -> bool:
    """Horovod's ``average``/``op`` pair to pushpull's ``average`` flag; other ops are refused by name."""
    if average is not None and op is not None:
        raise ValueError("pass either average= or op=, not both (Horovod's rule)")
    if op is None:
        return True if average is None else bool(average)
    if int(op) == Average:
        return True
    if int(op) == Sum:
        return False
    raise NotImplementedError(f"op={ReduceOp(int(op))!r}: the TensorFlow binding supports op=Average and op=Sum "
                              f"(Min, Max and Product run on the servers through pushpull.torch.allreduce, "
                              f"not from TensorFlow yet; Adasum nowhere)")


def _in_xla() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001 - a private API; without it XLA reports its own error
        return False


def _check_graph_ok(what: str) -> None:
    if _in_xla():
        raise RuntimeError(f"{what} inside an XLA-compiled function: pushpull's collectives run in Python "
                           f"(tf.py_function), which XLA cannot compile; compile the model with "
                           f"jit_compile=False (Keras: model.compile(..., jit_compile=False))")


# ------------------------------------------------------------------ reductions --

def _start_np(arr: np.ndarray, name: str, average: bool, priority: int, compression, prescale: float) -> int:
    arr = np.asarray(arr)
    if prescale != 1.0:
        arr = scaled(arr, prescale)  # a new array: the caller's is never written
    return _ctx.push_pull_async(arr, None, average, name, priority, compression)


def _finish_np(handle: int, like: np.dtype, postscale: float) -> np.ndarray:
    out = np.asarray(_ctx.synchronize(handle))
    if out.dtype != like:  # bfloat16 without ml_dtypes' type comes back as its bits
        out = out.view(like)
    if postscale != 1.0:
        out = scaled(out, postscale)
    return out


def _check_dtype(dtype: tf.DType, name: str) -> None:
    if dtype not in _REDUCIBLE:
        raise TypeError(f"push_pull of {name!r}: dtype {dtype.name} cannot be summed on the servers "
                        f"(supported: {sorted(d.name for d in _REDUCIBLE)}); broadcast it instead")


def _dense(t, name: str):
    """IndexedSlices (sparse gradients of embeddings) travel dense: the servers sum dense tensors
    (Horovod's sparse_as_dense=True); Horovod's allgather of the slices is not provided."""
    if isinstance(t, tf.IndexedSlices):
        return tf.convert_to_tensor(t)
    return t


def reduce_many(tensors: list, names: list[str], priorities: list[int] | None = None, average: bool = True,
                compression=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list:
    """Reduce several tensors at once (None entries pass through): all are started before any is waited
    for, in ascending priority (the backward order when priorities are minus the forward index).

    Eagerly: immediate. In a graph: one start op per tensor, fed by that tensor only, so a push starts
    as soon as its gradient exists; one wait op for all of them.
    """
    n = len(tensors)
    priorities = list(priorities) if priorities is not None else [0] * n
    if len(names) != n or len(priorities) != n:
        raise ValueError("reduce_many: tensors, names and priorities must have the same length")
    tensors = [None if t is None else _dense(tf.convert_to_tensor(t) if not isinstance(t, tf.IndexedSlices)
                                               else t, names[i]) for i, t in enumerate(tensors)]
    live = [i for i, t in enumerate(tensors) if t is not None]
    for i in live:
        _check_dtype(tensors[i].dtype, names[i])
    out = list(tensors)
    if not distributed():
        scale = prescale_factor * postscale_factor
        for i in live:
            out[i] = tensors[i] if scale == 1.0 else tensors[i] * tf.cast(scale, tensors[i].dtype)
        return out
    spec = normalize(compression, f"the reduction of {names[live[0]]!r}..." if compression is not None else "")
    order = sorted(live, key=lambda i: (priorities[i], -i))  # least urgent first: the backward order
    if tf.executing_eagerly():
        handles = {i: _start_np(tensors[i].numpy(), names[i], average, priorities[i], spec, prescale_factor)
                   for i in order}
        err = None
        for i in order:  # wait for every handle, even after a failure, so none is left behind
            try:
                out[i] = tf.convert_to_tensor(_finish_np(handles[i], tensors[i].dtype.as_numpy_dtype,
                                                         postscale_factor))
            except Exception as e:  # noqa: BLE001
                err = err or e
        if err is not None:
            raise err
        return out
    _check_graph_ok("a pushpull reduction")
    started = {}
    for i in order:
        def start(x, _i=i):
            return np.int64(_start_np(x.numpy(), names[_i], average, priorities[_i], spec, prescale_factor))
        started[i] = tf.py_function(start, [tensors[i]], tf.int64, name="pushpull_start")
    dtypes = [tensors[i].dtype for i in order]

    def wait(*hs):
        results, err = [], None
        for h, dt in zip(hs, dtypes):
            try:
                results.append(_finish_np(int(h.numpy()), dt.as_numpy_dtype, postscale_factor))
            except Exception as e:  # noqa: BLE001
                err = err or e
                results.append(None)
        if err is not None:
            raise err
        return results

    reduced = tf.py_function(wait, [started[i] for i in order], dtypes, name="pushpull_wait")
    if not isinstance(reduced, (list, tuple)):
        reduced = [reduced]
    for i, r in zip(order, reduced):
        r.set_shape(tensors[i].shape)
        out[i] = r
    return out


_unnamed = itertools.count()


def push_pull(tensor, scope: str = "", average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op=None, enable_async: bool = False,
              name: str | None = None, priority: int = 0, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0):
    """BytePS's ``push_pull``: the sum (``average=False`` / ``op=Sum``) or average over all workers.

    Unnamed calls are numbered in call order, so every rank must make them in the same order (as in
    Horovod, where the op name plays that part). ``enable_async`` (BytePS's asynchronous training) is
    not provided.
    """
    if enable_async:
        raise NotImplementedError("enable_async (asynchronous parameter updates) is not provided by pushpull")
    _ctx.need_init()
    name = name or f"tf.push_pull.{scope + '.' if scope else ''}noname.{next(_unnamed)}"
    return reduce_many([tensor], [name], [priority], _average_of(average, op), compression,
                       prescale_factor, postscale_factor)[0]


def allreduce(tensor, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression=Compression.none, op=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None):
    """Horovod's ``allreduce``: ``op=Average`` (default) or ``op=Sum``; the pre/post scale factors
    multiply the tensor before the push and the result after the pull."""
    return push_pull(tensor, average=average, compression=compression, op=op, name=name,
                     prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def grouped_allreduce(tensors, average: bool | None = None, compression=Compression.none, op=None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None):
    """Horovod's ``grouped_allreduce``: all in flight together."""
    _ctx.need_init()
    base = name or f"tf.grouped.noname.{next(_unnamed)}"
    return reduce_many(list(tensors), [f"{base}.{i}" for i in range(len(tensors))], None,
                       _average_of(average, op), compression, prescale_factor, postscale_factor)


# ------------------------------------------------------------------ broadcasts --

def _broadcast_np(arrays: list[np.ndarray], names: list[str], root_rank: int, check: bool) -> list[np.ndarray]:
    """Root's values for every array, bit-exact (the integer-view broadcast of pushpull.worker.broadcast)."""
    pairs = [(nm, np.asarray(a)) for nm, a in zip(names, arrays)]
    if check:  # every rank checks that all hold the same set of tensors, or all raise naming who differs
        return _bc.broadcast_checked(pairs, root_rank, prefix="tf.broadcast.")
    return _bc.broadcast_arrays(pairs, root_rank)


def _var_name(v, i: int) -> str:
    path = getattr(v, "path", None) or getattr(v, "name", None) or "var"
    return f"{i}.{path}"


def broadcast(tensor, root_rank: int, scope: str = "", name: str | None = None, is_variable: bool = True):
    """``root_rank``'s value of ``tensor`` on every rank (a new tensor), bit-exact for every dtype."""
    _ctx.need_init()
    _bc.check_root(root_rank)
    t = tf.convert_to_tensor(tensor)
    if not distributed():
        return tf.identity(t)
    name = "tf.bcast." + (name or f"{scope + '.' if scope else ''}noname.{next(_unnamed)}")
    if tf.executing_eagerly():
        return tf.convert_to_tensor(_broadcast_np([t.numpy()], [name], root_rank, check=False)[0])
    _check_graph_ok("broadcast")
    out = tf.py_function(lambda x: _broadcast_np([x.numpy()], [name], root_rank, check=False)[0], [t], t.dtype,
                         name="pushpull_broadcast")
    out.set_shape(t.shape)
    return out


def broadcast_variables(variables, root_rank: int, scope: str = "", prefix: str | None = None):
    """Assign ``root_rank``'s values to ``variables`` on every rank (model weights, optimizer slots).

    First every rank checks that all ranks pass the same set (count, dtypes, shapes); when one
    differs, every rank raises an error naming it, rather than waiting forever. Eagerly the variables
    are assigned at once; in a graph the returned op assigns them.
    """
    _ctx.need_init()
    _bc.check_root(root_rank)
    variables = list(variables)
    if not distributed() or not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    base = prefix or scope or "vars"
    names = [f"{base}.{_var_name(v, i)}" for i, v in enumerate(variables)]
    if tf.executing_eagerly():
        values = _broadcast_np([np.asarray(v.numpy()) for v in variables], names, root_rank, check=True)
        for v, val in zip(variables, values):
            v.assign(val)
        return None
    _check_graph_ok("broadcast_variables")
    dtypes = [tf.as_dtype(v.dtype) for v in variables]
    reads = [tf.convert_to_tensor(v) for v in variables]

    def run(*xs):
        return _broadcast_np([x.numpy() for x in xs], names, root_rank, check=True)

    got = tf.py_function(run, reads, dtypes, name="pushpull_broadcast_variables")
    if not isinstance(got, (list, tuple)):
        got = [got]
    return tf.group(*[v.assign(g) for v, g in zip(variables, got)])


def broadcast_global_variables(root_rank: int):
    """TF1 graphs: an op that broadcasts ``tf.compat.v1.global_variables()``. Eagerly there is no such
    collection (as in Horovod): use ``broadcast_variables(model.variables + optimizer.variables, root)``."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() does not support eager execution: use "
                           "broadcast_variables(model.variables, root_rank) (and the optimizer's variables)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank, prefix="global")


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, allow_pickle: bool | None = None):
    """``root_rank``'s object on every rank: JSON when it round-trips, else torch.save bytes that load
    without running code unless ``allow_pickle`` (docs/api.md: differs from Horovod on purpose)."""
    _ctx.need_init()
    return _bc.broadcast_object(obj, root_rank, name=name and "tf." + name, allow_pickle=allow_pickle)

