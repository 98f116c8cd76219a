"""Horovod's allreduce family (``horovod.torch``'s names and signatures) as real operations on the
servers, its op constants, process sets (the global one only), barrier and join; allgather, alltoall and
reducescatter are in :mod:`pushpull.torch.gather`, broadcasts in :mod:`pushpull.torch.functions`.

* ``op=Average|Sum|Min|Max|Product`` (Adasum: a clear error): the servers sum, take the minimum or
  maximum, or multiply; the op is part of the key's declaration, so ranks that disagree on it all fail.
  ``prescale_factor``/``postscale_factor`` apply on each worker, and travel in the round signature with
  the average flag, so ranks that disagree on those all fail too.
* ``allreduce`` and ``grouped_allreduce`` are differentiable as in Horovod: the gradient of a sum is the
  sum of the upstream gradients, of an average their average.
* Names: ``allreduce.<name>`` on the servers, shared with ``push_pull`` (:func:`pushpull.torch.ops.key_name`).
"""
from __future__ import annotations

import torch

from pushpull.torch import ops
from pushpull.torch.functions import _check_global
from pushpull.worker.compression import normalize
from pushpull.transport.protocol import round_sig
from pushpull.worker.engine import PLAIN, KeySpec

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
           "grouped_allreduce_async", "grouped_allreduce_async_", "barrier", "join",
           "ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class ReduceOp(int):
    """Horovod's reduction operators (the same integer values)."""

    _names = {0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product"}

    def __repr__(self) -> str:
        return self._names.get(int(self), f"ReduceOp({int(self)})")


Average, Sum, Adasum, Min, Max, Product = (ReduceOp(i) for i in range(6))
_SERVER_OP = {0: "sum", 1: "sum", 3: "min", 4: "max", 5: "product"}


class ProcessSet:
    """Horovod's process sets; only the global one (every worker) exists here."""

    def __init__(self, ranks=None):
        self.ranks = ranks
        self.is_global = ranks is None

    def __repr__(self) -> str:
        return "global_process_set" if self.is_global else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def add_process_set(process_set):
    raise NotImplementedError("process sets are not supported by pushpull: every collective runs over all "
                              "workers (a parameter server's round waits for every worker's push)")


remove_process_set = add_process_set


def _op(average, op) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("pass either average= or op=, not both (Horovod's rule)")
    if op is None:
        return Average if average is None or average else Sum
    if int(op) == Adasum:
        raise NotImplementedError("op=Adasum is not supported by pushpull: Adasum combines gradients pairwise "
                                  "(a tree of dot products), which a server's element-wise reduction cannot do; "
                                  "use op=Average (or Sum)")
    if int(op) not in _SERVER_OP:
        raise ValueError(f"op={op!r} is not one of Average, Sum, Min, Max, Product")
    return ReduceOp(int(op))


def _spec(op: ReduceOp, kind: str = ops.KIND, **kw) -> KeySpec:
    server_op = _SERVER_OP[int(op)]
    if server_op == "sum" and kind == ops.KIND and not kw:
        return PLAIN  # the same key as push_pull's
    return KeySpec(kind=kind, op=server_op, **kw)


def _scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t * factor`` in ``t``'s dtype (integers truncate toward zero, as a cast does)."""
    if factor == 1.0:
        return t
    if t.dtype.is_floating_point or t.is_complex():
        return t * factor
    return (t.double() * factor).to(t.dtype)


def _scale_into(out: torch.Tensor, factor: float) -> torch.Tensor:
    if factor != 1.0:
        out.copy_(_scale(out, factor))
    return out


# ------------------------------------------------------------------ allreduce --

def _allreduce_start(tensor, output, average, name, op, prescale_factor, postscale_factor, process_set,
                     compression=None, priority: int = 0, key: str | None = None) -> int:
    ops._need_init()
    _check_global(process_set)
    op = _op(average, op)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allreduce expects a torch.Tensor, got {type(tensor).__name__}")
    if compression is not None:
        compression = normalize(compression, f"allreduce of {name!r}" if name else "an unnamed allreduce")
    if op != Average and op != Sum and compression is not None and getattr(compression, "spec", None):
        raise ValueError(f"op={op!r} with compression {compression!r}: compressed tensors can only be summed")
    key = key or ops.key_name(ops.KIND, name, ops.like(tensor, _SERVER_OP[int(op)]) if name is None else "")
    sig = round_sig(average=op == Average, scale=(float(prescale_factor), float(postscale_factor)))
    src = _scale(tensor.detach(), prescale_factor)  # in place with a prescale: a scaled copy is pushed
    h = ops.submit_key(src, output, op == Average, key, priority, compression, _spec(op), sig)
    if postscale_factor == 1.0:
        return h
    return ops.register_pending(key, [h], lambda outs: _scale_into(outs[0], postscale_factor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    """Start reducing ``tensor`` over all workers into a new tensor; ``synchronize`` returns it."""
    return _allreduce_start(tensor, None, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    """In place: ``synchronize`` returns ``tensor`` holding the result."""
    return _allreduce_start(tensor, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set) -> torch.Tensor:
    return ops.synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                            process_set))


def _grad_name(name):
    return f"{name}.grad" if name is not None else None


class _Allreduce(torch.autograd.Function):
    """Gradient of a sum is the sum of the upstream gradients, of an average their average (Horovod);
    of a min or max, the summed upstream gradient goes to the ranks that hold the extreme."""

    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, compression):
        ctx.name, ctx.op, ctx.pre, ctx.post = name, op, pre, post
        out = ops.synchronize(_allreduce_start(tensor, None, None, name, op, pre, post, None, compression))
        if op in (Min, Max):
            ctx.save_for_backward(tensor, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.op == Product:
            raise NotImplementedError("the gradient of allreduce(op=Product) is not provided")
        if ctx.op in (Min, Max):
            tensor, out = ctx.saved_tensors
            summed = allreduce(grad, name=_grad_name(ctx.name), op=Sum)
            return summed * (_scale(tensor, ctx.pre) * ctx.post == out), None, None, None, None, None
        return allreduce(grad, name=_grad_name(ctx.name), op=ctx.op, prescale_factor=ctx.pre,
                         postscale_factor=ctx.post), None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """Horovod's ``allreduce``: a new tensor with the reduction over all workers (default: the average).
    Differentiable. Its name on the servers is ``allreduce.<name>`` (shared with ``push_pull``)."""
    ops._need_init()
    _check_global(process_set)
    op = _op(average, op)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, compression)
    if compression is None and prescale_factor == 1.0 and postscale_factor == 1.0:  # the direct path may do it
        sig = round_sig(average=op == Average)
        key = ops.key_name(ops.KIND, name, ops.like(tensor, _SERVER_OP[int(op)]) if name is None else "")
        return ops.reduce_now(tensor, None, op == Average, key, None, _spec(op), sig)
    return ops.synchronize(_allreduce_start(tensor, None, None, name, op, prescale_factor, postscale_factor,
                                            None, compression))


# ------------------------------------------------------------------ grouped --

def _grouped_start(tensors, inplace, average, name, op, pre, post, process_set, compression=None) -> int:
    ops._need_init()
    like = "group." + "+".join(ops.like(t, _SERVER_OP[int(_op(average, op))]) for t in tensors)
    base = ops.key_name(ops.KIND, name, like if name is None else "")
    hs = [_allreduce_start(t, t if inplace else None, average, None, op, pre, post, process_set, compression,
                           key=f"{base}.{i}") for i, t in enumerate(tensors)]
    return ops.register_pending(base, hs, list)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    """Several reductions in flight together; ``synchronize`` returns the list of results. The i-th tensor
    is ``allreduce.<name>.<i>`` on the servers."""
    return _grouped_start(tensors, False, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    return _grouped_start(tensors, True, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set) -> list:
    return ops.synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                    postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, pre, post, compression, *tensors):
        ctx.name, ctx.op, ctx.pre, ctx.post = name, op, pre, post
        if op not in (Average, Sum):
            raise NotImplementedError(f"the gradient of grouped_allreduce(op={op!r}) is not provided")
        return tuple(ops.synchronize(_grouped_start(tensors, False, None, name, op, pre, post, None, compression)))

    @staticmethod
    def backward(ctx, *grads):
        out = grouped_allreduce([g.contiguous() for g in grads], name=_grad_name(ctx.name), op=ctx.op,
                                prescale_factor=ctx.pre, postscale_factor=ctx.post)
        return (None, None, None, None, None, *out)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set) -> list:
    """Horovod's ``grouped_allreduce``: a list of new tensors, all reduced together. Differentiable."""
    ops._need_init()
    _check_global(process_set)
    op = _op(average, op)
    tensors = list(tensors)
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return list(_GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, compression, *tensors))
    return ops.synchronize(_grouped_start(tensors, False, None, name, op, prescale_factor, postscale_factor,
                                          None, compression))


# ------------------------------------------------------------------ barrier, join, build facts --

def barrier(process_set=global_process_set) -> None:
    """Horovod's ``barrier``: wait until every worker reaches this point (the scheduler's barrier)."""
    _check_global(process_set)
    ops.barrier()


def join(device: int = -1) -> int:
    """Horovod's join(): this worker has no more data. Until every worker has joined, the others' reductions
    complete without it (it contributes nothing: as zeros to a sum or an average over size(); a min, max or
    product is taken over the workers still training); returns the rank that joined last."""
    eng = ops.engine()
    if eng is None:
        ops._need_init()
        return ops.rank()
    return eng.join()


def _no() -> bool:
    """pushpull uses neither MPI, Gloo, NCCL, DDL nor oneCCL for its collectives."""
    return False


mpi_built = mpi_enabled = mpi_threads_supported = gloo_built = gloo_enabled = _no
nccl_built = ddl_built = ccl_built = cuda_built = rocm_built = _no
