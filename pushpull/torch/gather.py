"""Horovod's allgather, allgather_object, alltoall and reducescatter over the parameter servers.

``allgather`` and ``alltoall`` first agree on every rank's first dimension (or splits) in one small
exchange that also checks dtype and trailing shape; then each rank pushes only its rows, which a server
writes at the rank's offset of a *concat* key. ``alltoall`` and ``reducescatter`` use one key per
destination rank that only that rank receives (the others' pulls are answered with an empty body when
the round completes), so a slice travels only to where it is needed and nothing is gathered on one rank.
All four are differentiable as in Horovod.
"""
from __future__ import annotations

import numbers

import torch

from pushpull.torch import ops
from pushpull.torch.collectives import _SERVER_OP, Average, Sum, _grad_name, _op, _scale, _scale_into, _spec, allreduce, \
    global_process_set
from pushpull.torch.functions import BroadcastError, _check_global, _distributed
from pushpull.worker.broadcast import decode as _decode, encode as _encode
from pushpull.transport.protocol import SIG_DTYPES, round_sig
from pushpull.worker.engine import KeySpec
from pushpull.worker.handle import PushPullError

__all__ = ["allgather", "allgather_async", "allgather_object", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
           "grouped_reducescatter_async"]


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
        if not table[k].any():  # a rank in join() pushes nothing (a zero row): it contributes no rows
            continue
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
        return _from_bytes(buf, t.dtype, shape).to(t.device)
    return ops.register_pending(key, [h] if h is not None else [], finish), sizes


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (first dimensions may differ; the
    ranks agree on them first, which this call waits for); ``synchronize`` returns the result."""
    return _allgather_start(tensor, name, process_set)[0]


class _Allgather(torch.autograd.Function):
    """The gradient of rank r's input is rank r's rows of the average of every rank's upstream gradient
    (Horovod's convention: each rank's loss is taken as one share of an averaged loss)."""

    @staticmethod
    def forward(ctx, tensor, name):
        h, sizes = _allgather_start(tensor, name, None)
        ctx.name, ctx.sizes, ctx.shape = name, sizes, tensor.shape
        return ops.synchronize(h)

    @staticmethod
    def backward(ctx, grad):
        averaged = allreduce(grad.contiguous(), name=_grad_name(ctx.name), op=Average)
        start = sum(ctx.sizes[:ops.rank()])
        return averaged[start:start + ctx.sizes[ops.rank()]].reshape(ctx.shape), None


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
    if isinstance(splits, torch.Tensor) and (splits.dtype.is_floating_point or splits.is_complex()):
        raise ValueError(f"alltoall: splits must be integers, got a {splits.dtype} tensor {splits.tolist()}")
    raw = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    bad = [s for s in raw if isinstance(s, bool) or not isinstance(s, numbers.Integral)]
    if bad:
        raise ValueError(f"alltoall: splits must be integers, got {raw} ({bad[0]!r} is a {type(bad[0]).__name__})")
    splits = [int(s) for s in raw]
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
        return _from_bytes(buf, t.dtype, shape).to(t.device), received
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
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"reducescatter expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() == 0:
        raise ValueError(f"reducescatter of {name!r}: a 0-d tensor (a scalar) has no first dimension to scatter; "
                         f"give it at least one dimension (tensor.reshape(1))")
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
    empty = torch.zeros((0, *src.shape[1:]), dtype=src.dtype, device=tensor.device)

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
        # Horovod's convention: the gathered upstream gradient, times size() for a Sum (1x for an Average)
        ctx.name, ctx.op, ctx.scale = name, op, pre * post * (ops.size() if op == Sum else 1)
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


# ------------------------------------------------------------------ grouped --

def _group_base(kind: str, tensors: list, name, op: str = "") -> str:
    """The group's name without its kind: ``name``, or an unnamed slot whose key holds what the group moves
    (so its parts' names are freed with it when it is synchronized)."""
    if name is not None:
        return str(name)
    # an allgather's first dimensions may differ by rank (its parts agree on layouts themselves)
    like = "" if kind == "allgather" else "group." + "+".join(ops.like(t, op or "sum") for t in tensors)
    return ops.key_name(kind, None, like)[len(kind) + 1:]


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """Several allgathers in flight together (the i-th is ``allgather.<name>.<i>``); ``synchronize``
    returns the list of results. Each agrees on its ranks' first dimensions first, in turn."""
    ops._need_init()
    _check_global(process_set)
    tensors = list(tensors)
    base = _group_base("allgather", tensors, name)
    hs = [_allgather_start(t, f"{base}.{i}", process_set)[0] for i, t in enumerate(tensors)]
    return ops.register_pending(f"allgather.{base}", hs, list)


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list:
    """Horovod's ``grouped_allgather``: a list with every tensor's allgather (not differentiable here)."""
    return ops.synchronize(grouped_allgather_async(tensors, name, process_set))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Several reducescatters in flight together (the i-th is ``reducescatter.<name>.<i>``); ``synchronize``
    returns the list of this rank's parts, within one deadline for them all."""
    ops._need_init()
    _check_global(process_set)
    tensors = list(tensors)
    base = _group_base("reducescatter", tensors, name, _SERVER_OP[int(_op(None, op))])
    hs = [_reducescatter_start(t, f"{base}.{i}", op, prescale_factor, postscale_factor, process_set)
          for i, t in enumerate(tensors)]
    return ops.register_pending(f"reducescatter.{base}", hs, list)


def grouped_reducescatter(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> list:
    """Horovod's ``grouped_reducescatter``: a list with every tensor's reducescatter (not differentiable here)."""
    return ops.synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                       postscale_factor))
