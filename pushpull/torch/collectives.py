"""Horovod's collectives (``horovod.torch``'s names and signatures) as real operations on the servers.

* ``allreduce`` and friends: ``op=Average|Sum|Min|Max|Product`` (Adasum: a clear error); the servers
  sum, take the minimum or maximum, or multiply (the op is part of the key's declaration and is checked
  across workers); ``prescale_factor``/``postscale_factor`` apply on each worker.
* ``allgather``: the ranks first agree on every rank's first dimension (and check dtype and trailing
  shape), then each pushes only its rows, which a server writes at the rank's offset of a concat key.
* ``alltoall`` / ``reducescatter``: one key per destination rank, received only by that rank (the
  others' pulls are answered with an empty body when the round completes), so a slice travels only to
  where it is needed; nothing is gathered on one rank.
* Autograd: ``allreduce``, ``grouped_allreduce``, ``allgather``, ``alltoall``, ``reducescatter`` (and
  ``broadcast`` in :mod:`pushpull.torch.functions`) are differentiable as in Horovod.

Names: every kind has its own name space on the servers (``allreduce.<name>``, ``allgather.<name>``, ...),
unnamed calls are numbered per kind in call order (:func:`pushpull.torch.ops.key_name`).
"""
from __future__ import annotations

import torch

from pushpull.torch import ops
from pushpull.torch.functions import BroadcastError, _check_global, _decode, _encode, _distributed
from pushpull.transport.protocol import SIG_DTYPES, round_sig
from pushpull.worker.engine import PLAIN, KeySpec
from pushpull.worker.handle import PushPullError

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
           "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
           "allgather_object", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
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


# ------------------------------------------------------------------ shapes agreed first --

_DIMS = 5  # trailing dimensions carried as values; more are carried as a hash


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8)


def _from_bytes(buf: torch.Tensor, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    if dtype.is_complex:
        real = torch.empty((), dtype=dtype).real.dtype
        return torch.view_as_complex(_from_bytes(buf, real, (*shape, 2)).contiguous())
    if buf.numel() == 0:
        return torch.zeros(shape, dtype=dtype)
    return buf.contiguous().view(dtype).reshape(shape).clone()


def _dtype_code(dtype: torch.dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in SIG_DTYPES:
        raise TypeError(f"dtype {dtype} cannot travel (supported: {', '.join(SIG_DTYPES)})")
    return SIG_DTYPES.index(name)


def _describe_row(row: list[int]) -> str:
    code, ndim = row[0], row[1]
    dims = row[2:2 + min(ndim - 1, _DIMS)]
    more = "" if ndim - 1 <= _DIMS else f"+{ndim - 1 - _DIMS} more"
    return f"{SIG_DTYPES[code]} [*, {', '.join(map(str, dims))}{more}]"


def _layout_row(t: torch.Tensor) -> list[int]:
    """dtype, number of dimensions and trailing dimensions: what every rank's tensor must share."""
    shape = list(t.shape) or [1]
    trailing = shape[1:]
    dims = trailing[:_DIMS] + [0] * (_DIMS - len(trailing[:_DIMS]))
    extra = hash(tuple(trailing[_DIMS:])) & 0x7FFFFFFF if len(trailing) > _DIMS else 0
    return [_dtype_code(t.dtype), len(shape), *dims, extra]


def _agree_rows(key: str, row: list[int], what: str) -> torch.Tensor:
    """Every rank's ``row`` of small integers, on every rank (a sum where each rank fills its own row)."""
    n, r = ops.size(), ops.rank()
    table = torch.zeros(n, len(row), dtype=torch.int64)
    table[r] = torch.tensor(row, dtype=torch.int64)
    table = ops.reduce_now(table, None, False, f"{key}.layout", spec=KeySpec(kind=what),
                           sig=round_sig(average=False))
    layouts = {}
    for k in range(n):
        layouts.setdefault(tuple(table[k, :_DIMS + 3].tolist()), []).append(k)
    if len(layouts) > 1:
        detail = "; ".join(f"rank(s) {rs} gave {_describe_row(list(lay))}" for lay, rs in layouts.items())
        raise PushPullError(f"{what} of {key!r}: the workers disagree on dtype or shape (all but the first "
                            f"dimension must match): {detail}")
    return table


def _bucket(nbytes: int) -> int:
    """A concat key's size: ``nbytes`` rounded up to 1/16 of its power of two (at most 6 % padding, and
    few keys when sizes vary from call to call)."""
    step = 1 << max(0, nbytes.bit_length() - 4)
    return -(-nbytes // step) * step


def _row_bytes(t: torch.Tensor) -> int:
    shape = list(t.shape) or [1]
    n = 1
    for d in shape[1:]:
        n *= d
    return n * t.element_size()


def _concat_start(key: str, kind: str, data: torch.Tensor, offset: int, total: int, readers) -> int | None:
    """Push this rank's bytes at ``offset`` of a ``total``-byte concat key; None when it is empty."""
    if total == 0:
        return None
    cap = _bucket(total)
    spec = KeySpec(kind=kind, op="concat", numel=cap, readers=readers)
    return ops.submit_key(data, None, False, f"{key}.c{cap}", spec=spec, offset=offset)


# ------------------------------------------------------------------ allgather --

def _allgather_start(tensor: torch.Tensor, name, process_set, kind: str = "allgather"):
    """Returns (handle, sizes): ``synchronize(handle)`` gives the concatenation along dimension 0."""
    ops._need_init()
    _check_global(process_set)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allgather expects a torch.Tensor, got {type(tensor).__name__}")
    key = ops.key_name(kind, name)
    t = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    if not _distributed():
        return ops.register_pending(key, [], lambda outs: t.clone()), [t.shape[0]]
    row = _layout_row(t) + [t.shape[0]]
    table = _agree_rows(key, row, kind)
    sizes = table[:, -1].tolist()
    rb = _row_bytes(t)
    offset, total = sum(sizes[:ops.rank()]) * rb, sum(sizes) * rb
    shape = (sum(sizes), *t.shape[1:])
    h = _concat_start(key, kind, _as_bytes(t), offset, total, None)

    def finish(outs):
        buf = outs[0][:total] if outs else torch.zeros(0, dtype=torch.uint8)
        return _from_bytes(buf, t.dtype, shape)
    return ops.register_pending(key, [h] if h is not None else [], finish), sizes


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (first dimensions may differ; the
    ranks agree on them first, which this call waits for); ``synchronize`` returns the result."""
    return _allgather_start(tensor, name, process_set)[0]


class _Allgather(torch.autograd.Function):
    """The gradient of rank r's input is rank r's rows of the sum of every rank's upstream gradient."""

    @staticmethod
    def forward(ctx, tensor, name):
        h, sizes = _allgather_start(tensor, name, None)
        ctx.name, ctx.sizes, ctx.shape = name, sizes, tensor.shape
        return ops.synchronize(h)

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce(grad.contiguous(), name=_grad_name(ctx.name), op=Sum)
        start = sum(ctx.sizes[:ops.rank()])
        return summed[start:start + ctx.sizes[ops.rank()]].reshape(ctx.shape), None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Horovod's ``allgather``: every rank's tensor concatenated along dimension 0, in rank order.
    Any dtype (bool and complex included); first dimensions may differ. Differentiable."""
    ops._need_init()
    _check_global(process_set)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allgather.apply(tensor, name)
    return ops.synchronize(allgather_async(tensor, name))


def allgather_object(obj, name=None, process_set=global_process_set, allow_pickle: bool | None = None) -> list:
    """Horovod's ``allgather_object``: the list of every rank's ``obj``, in rank order. Objects travel as
    in ``broadcast_object`` (JSON, else ``torch.save`` bytes loaded without running code unless
    ``allow_pickle``/``PUSHPULL_ALLOW_PICKLE`` is set on the receiving ranks)."""
    ops._need_init()
    _check_global(process_set)
    if not _distributed():
        return [obj]
    data = _encode(obj, allow_pickle=True)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    h, sizes = _allgather_start(buf, name, None, kind="allgather_object")
    out = ops.synchronize(h)
    if allow_pickle is None:
        allow_pickle = bool(ops.config().allow_pickle)
    result, off = [], 0
    for r, n in enumerate(sizes):
        if r == ops.rank():
            result.append(obj)
        else:
            try:
                result.append(_decode(bytes(out[off:off + n].numpy()), allow_pickle, f"allgather_object {name!r}"))
            except BroadcastError as e:
                raise BroadcastError(f"{e} (object from rank {r})") from None
        off += n
    return result


# ------------------------------------------------------------------ alltoall --

def _splits_of(tensor: torch.Tensor, splits, n: int) -> list[int]:
    dim0 = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        if dim0 % n:
            raise ValueError(f"alltoall without splits: the first dimension ({dim0}) is not a multiple of the "
                             f"number of workers ({n})")
        return [dim0 // n] * n
    splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(splits) != n:
        raise ValueError(f"alltoall: splits has {len(splits)} entries for {n} workers")
    if any(s < 0 for s in splits) or sum(splits) > dim0:
        raise ValueError(f"alltoall: splits {splits} must be >= 0 and sum to at most the first dimension ({dim0})")
    return splits


def _alltoall_start(tensor, splits, name, process_set) -> int:
    ops._need_init()
    _check_global(process_set)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"alltoall expects a torch.Tensor, got {type(tensor).__name__}")
    n, r = ops.size(), ops.rank()
    t = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    mine = _splits_of(t, splits, n)
    key = ops.key_name("alltoall", name)
    if not _distributed():
        out = t[:mine[0]].clone()
        return ops.register_pending(key, [], lambda outs: (out, torch.tensor(mine, dtype=torch.int32)))
    table = _agree_rows(key, _layout_row(t) + mine, "alltoall")
    sent = table[:, -n:]  # sent[src][dst]: rows src sends to dst
    rb = _row_bytes(t)
    data = _as_bytes(t)
    handles, mine_at = [], None
    start = 0
    for j in range(n):
        rows_before = int(sent[:r, j].sum())
        total = int(sent[:, j].sum()) * rb
        piece = data[start * rb:(start + mine[j]) * rb]
        start += mine[j]
        h = _concat_start(f"{key}.to{j}", "alltoall", piece, rows_before * rb, total, (j,))
        if h is not None:
            if j == r:
                mine_at = len(handles)
            handles.append(h)
    received = sent[:, r].to(torch.int32)
    shape = (int(received.sum()), *t.shape[1:])
    total_r = shape[0] * rb

    def finish(outs):
        buf = outs[mine_at][:total_r] if mine_at is not None else torch.zeros(0, dtype=torch.uint8)
        return _from_bytes(buf, t.dtype, shape), received
    return ops.register_pending(key, handles, finish)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)``. The ranks first agree on
    every rank's splits (this call waits for that), then each slice goes only to its destination."""
    return _alltoall_start(tensor, splits, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = ops.synchronize(_alltoall_start(tensor, splits, name, None))
        ctx.received, ctx.name, ctx.shape = received, name, tensor.shape
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _dead):
        back, _ = ops.synchronize(_alltoall_start(grad.contiguous(), ctx.received, _grad_name(ctx.name), None))
        return back.reshape(ctx.shape), None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Horovod's ``alltoall``: rank r sends ``splits[j]`` rows of ``tensor`` (dimension 0; equal parts
    without ``splits``) to rank j and receives the rows every rank sent it, in rank order. Returns the
    output, and with ``splits`` also the received splits. Differentiable."""
    ops._need_init()
    _check_global(process_set)
    if tensor.requires_grad and torch.is_grad_enabled():
        out, received = _Alltoall.apply(tensor, splits, name)
    else:
        out, received = ops.synchronize(alltoall_async(tensor, splits, name))
    return out if splits is None else (out, received)


# ------------------------------------------------------------------ reducescatter --

def _chunks(dim0: int, n: int) -> list[int]:
    """Rows of each rank's part: the first ``dim0 % n`` ranks get one more."""
    return [dim0 // n + (1 if j < dim0 % n else 0) for j in range(n)]


def _reducescatter_start(tensor, name, op, pre, post, process_set) -> int:
    ops._need_init()
    _check_global(process_set)
    op = _op(None, op)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise TypeError("reducescatter expects a torch.Tensor with at least one dimension")
    n, r = ops.size(), ops.rank()
    key = ops.key_name("reducescatter", name, ops.like(tensor, _SERVER_OP[int(op)]) if name is None else "")
    src = _scale(tensor.detach(), pre).contiguous()
    rows = _chunks(src.shape[0], n)
    sig = round_sig(average=op == Average, scale=(float(pre), float(post)))
    handles, mine_at, start = [], None, 0
    for j in range(n):
        part = src[start:start + rows[j]]
        start += rows[j]
        if rows[j] == 0:
            continue
        spec = _spec(op, "reducescatter", readers=(j,), meta=(("shape", tuple(src.shape)),))
        if j == r:
            mine_at = len(handles)
        handles.append(ops.submit_key(part, None, op == Average, f"{key}.part{j}", spec=spec, sig=sig))
    empty = torch.zeros((0, *src.shape[1:]), dtype=src.dtype)

    def finish(outs):
        out = outs[mine_at] if mine_at is not None else empty
        return _scale_into(out, post)
    return ops.register_pending(key, handles, finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    return _reducescatter_start(tensor, name, op, prescale_factor, postscale_factor, process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post):
        if op not in (Average, Sum):
            raise NotImplementedError(f"the gradient of reducescatter(op={op!r}) is not provided")
        ctx.name, ctx.op, ctx.scale = name, op, pre * post / (ops.size() if op == Average else 1)
        return ops.synchronize(_reducescatter_start(tensor, name, op, pre, post, None))

    @staticmethod
    def backward(ctx, grad):
        return _scale(allgather(grad.contiguous(), name=_grad_name(ctx.name)), ctx.scale), None, None, None, None


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Horovod's ``reducescatter``: reduce over all workers, then rank r keeps its part of dimension 0 (the
    first ``dim0 % size`` ranks get one row more). Each part is a key received by its rank only.
    Differentiable for Average and Sum."""
    ops._need_init()
    _check_global(process_set)
    if compression is not None and getattr(compression, "spec", None):
        raise ValueError("reducescatter does not compress (pass no compression)")
    op = _op(None, op)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Reducescatter.apply(tensor, name, op, prescale_factor, postscale_factor)
    return ops.synchronize(_reducescatter_start(tensor, name, op, prescale_factor, postscale_factor, None))


# ------------------------------------------------------------------ barrier, join, build facts --

def barrier(process_set=global_process_set) -> None:
    """Horovod's ``barrier``: wait until every worker reaches this point (the scheduler's barrier)."""
    _check_global(process_set)
    ops.barrier()


def join(device: int = -1) -> int:
    raise NotImplementedError("join() is not provided by pushpull: a parameter server's round waits for "
                              "every worker's push, so a worker that ran out of data cannot stand in for the "
                              "others' reductions; give every worker the same number of steps (e.g. a "
                              "DistributedSampler with drop_last=True)")


def _no() -> bool:
    """pushpull uses neither MPI, Gloo, NCCL, DDL nor oneCCL for its collectives."""
    return False


mpi_built = mpi_enabled = mpi_threads_supported = gloo_built = gloo_enabled = _no
nccl_built = ddl_built = ccl_built = cuda_built = rocm_built = _no
