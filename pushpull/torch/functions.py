"""Broadcasts, Horovod/BytePS-shaped: parameters, optimizer state, objects.

A broadcast is a push_pull sum in which every rank but the root contributes
zeros. The bits travel as an integer view of the tensor (float32 as int32,
float16 as int16, ...), so ``0 + x`` is exact for every value, -0.0 and NaN
payloads included, and the root's own tensors are never written.

Every rank must call these functions in the same order with the same names;
when the ranks disagree (different parameter sets, different optimizer
layouts) every rank raises an error naming the ranks that differ, instead of
waiting forever.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from pushpull import dtypes
from pushpull.torch import ops
from pushpull.transport.protocol import round_sig
from pushpull.worker import broadcast as _neutral
from pushpull.worker.broadcast import BroadcastError  # noqa: F401 - one class for every binding
from pushpull.worker.engine import KeySpec

__all__ = ["broadcast", "broadcast_", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "BroadcastError"]

# same-size integer dtype that carries a tensor's bits exactly through a sum with zeros
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
KIND = "broadcast"
_SPEC = KeySpec(kind=KIND)


def _distributed() -> bool:
    return ops.size() > 1 or ops.config().force_distributed


def _check_root(root_rank: int) -> None:
    _neutral.check_root(root_rank)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A contiguous integer view of ``t``'s bytes (a copy only if ``t`` is not contiguous)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous()
    size = t.element_size()
    if size not in _BITS:
        raise TypeError(f"cannot broadcast dtype {t.dtype}")
    if t.dtype == _BITS[size]:
        return t
    if t.dim() == 0:
        return t.reshape(1).view(_BITS[size]).reshape(())
    return t.view(_BITS[size])


def _start(tensor: torch.Tensor, root_rank: int, name: str):
    """Start broadcasting ``tensor`` (root's value wins) under the server-side name ``name``; returns
    what :func:`_finish` needs. Every rank's push carries its root_rank and dtype (the round signature),
    so ranks that disagree on either all fail, told who gave what, instead of summing different bits."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"broadcast of {name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
    sig = round_sig(root=root_rank, dtype=str(tensor.dtype).replace("torch.", ""))
    if ops.rank() == root_rank:
        # root: push a view of its bits; the pulled sum goes to a new tensor, the root's is untouched
        return ops.submit_key(_bits(tensor), None, False, name, spec=_SPEC, sig=sig), None
    zeros = torch.zeros_like(_bits(tensor), memory_format=torch.contiguous_format)
    return ops.submit_key(zeros, zeros, False, name, spec=_SPEC, sig=sig), (tensor, zeros)


def _finish(started) -> None:
    _finish_output(started, ops.synchronize(started[0]))


def _finish_output(started, out) -> None:
    """Write the pulled bits into the destination (not on the root, whose tensor is never written)."""
    _, dest = started
    if dest is None:
        return
    tensor, bits = dest
    with torch.no_grad():
        if tensor.is_complex():
            target = torch.view_as_real(tensor)
        else:
            target = tensor
        src = bits if bits.device == target.device else bits.to(target.device)
        if target.dim() == 0:
            target.copy_(src.reshape(1).view(target.dtype).reshape(()))
        else:
            target.copy_(src.view(target.dtype))
    del out


def _broadcast_many(tensors: Iterable[tuple[str, torch.Tensor]], root_rank: int) -> None:
    """Broadcast ``(name, tensor)`` pairs in place from ``root_rank``; all in flight at once."""
    started = [_start(t, root_rank, name) for name, t in tensors]
    if not started:
        return
    # one handle, so one deadline for them all (not PUSHPULL_TIMEOUT per tensor in turn), and every part
    # waited for even after a failure, so no handle is left behind
    outs = ops.synchronize(ops.register_pending(ops.handle_name(started[0][0]),
                                                [s[0] for s in started], list))
    for s, out in zip(started, outs):
        _finish_output(s, out)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set=None) -> int:
    """Horovod's ``broadcast_async_``: start overwriting ``tensor`` with ``root_rank``'s; ``synchronize``
    returns it. Its name on the servers is ``broadcast.<name>`` (unnamed calls are numbered, so every rank
    must make them in the same order)."""
    ops._need_init()
    _check_global(process_set)
    _check_root(root_rank)
    key = ops.key_name(KIND, name, ops.like(tensor) if name is None else "")
    if not _distributed():
        return ops.register_pending(key, [], lambda outs: tensor)
    started = _start(tensor, root_rank, key)

    def finish(outs):
        _finish_output(started, outs[0])
        return tensor
    return ops.register_pending(key, [started[0]], finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set=None) -> int:
    """Horovod's ``broadcast_async``: ``synchronize`` returns a new tensor holding root's value."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set=None) -> torch.Tensor:
    """Horovod's ``broadcast_``: overwrite ``tensor`` with ``root_rank``'s, in place; returns it."""
    return ops.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """Differentiable broadcast: every rank's output is the root's input, so the root's gradient is the
    sum of every rank's upstream gradient, and the others' is zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        ctx.name = name
        return broadcast_(tensor.detach().clone(), root_rank, name)

    @staticmethod
    def backward(ctx, grad_output):
        key = ops.key_name(ops.KIND, f"{ctx.name}.grad" if ctx.name else None, ops.like(grad_output))
        grad = ops.reduce_now(grad_output.contiguous(), None, False, key, sig=round_sig(average=False))
        if ops.rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set=None) -> torch.Tensor:
    """Horovod's ``broadcast``: a new tensor holding ``root_rank``'s value (``tensor`` is untouched);
    differentiable: the root's input gets the sum of every rank's gradient (Horovod 0.21+ averages)."""
    _check_global(process_set)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Broadcast.apply(tensor, root_rank, name)
    return broadcast_(tensor.detach().clone(), root_rank, name)


def _check_global(process_set) -> None:
    if process_set is not None and not getattr(process_set, "is_global", False):
        raise NotImplementedError("process sets are not supported by pushpull: every collective runs over all "
                                  "workers (pass no process_set, or global_process_set)")


def _items(params) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        items = list(params)
    out = []
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError("broadcast_parameters expects a state_dict or an iterable of (name, tensor) pairs, "
                            "e.g. model.state_dict() or model.named_parameters()")
        name, t = entry
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor; "
                            f"broadcast non-tensor values with broadcast_object")
        out.append((str(name), t))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"broadcast_parameters: duplicate names {dups}")
    return out


def average_gradients(named_parameters, prefix: str) -> None:
    """Every gradient of ``named_parameters`` averaged over the workers, in place, all in flight at once and
    waited for: the reduction of trainers that hand over a whole backward pass (pushpull.huggingface,
    pushpull.lightning). A parameter without a gradient this step (unused) pushes zeros, so that every worker
    pushes the same tensors; names are ``prefix`` + the parameter's own, the same on every worker."""
    handles = []
    for name, p in named_parameters:
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        handles.append(ops.push_pull_async_inplace(p.grad, average=True, name=f"{prefix}{name}"))
    for h in handles:
        ops.synchronize(h)


def broadcast_parameters(params, root_rank: int, prefix: str = "parameters.", process_set=None) -> None:
    """Set every rank's tensors to ``root_rank``'s, in place.

    ``params``: a ``state_dict()`` (parameters and buffers) or an iterable of
    ``(name, tensor)`` such as ``model.named_parameters()``. CPU and GPU
    tensors of any dtype; the root's tensors are left bit-identical. The names
    key the transfer (``broadcast.<prefix><name>`` on the servers), so every rank must pass the same set.
    """
    ops._need_init()
    _check_global(process_set)
    _check_root(root_rank)
    items = _items(params)
    if not _distributed():
        return
    base = f"{KIND}.{prefix}"
    fp = np.array([_neutral.fingerprint([(n, str(t.dtype).replace("torch.", ""), tuple(t.shape))
                                         for n, t in items])], dtype=np.int64)
    got = _neutral.broadcast_arrays([(base + "__fingerprint__", fp)], root_rank)[0]
    _neutral.agree(bool(got[0] == fp[0]), "the set of tensors to broadcast (names, dtypes, shapes)",
                   f"{len(items)} tensors: {[n for n, _ in items[:5]]}...", base + "__agree__")
    _broadcast_many([(base + n, t) for n, t in items], root_rank)


# ------------------------------------------------------------------ objects --

_decode = _neutral.decode


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, allow_pickle: bool | None = None,
                     process_set=None):
    """Return ``root_rank``'s ``obj`` on every rank.

    JSON-able objects (that round-trip exactly) travel as JSON; anything else as ``torch.save`` bytes,
    which the other ranks load with ``weights_only=True``: tensors, dicts, lists, numbers and strings
    arrive, and no code from the wire runs. Objects that need pickle to rebuild (your own classes) need
    ``allow_pickle=True`` (or ``PUSHPULL_ALLOW_PICKLE=1``) on the receiving ranks; Horovod always
    unpickles (cloudpickle), docs/api.md says why we differ. The object travels as a uint8 tensor.
    """
    ops._need_init()
    _check_global(process_set)
    return _neutral.broadcast_object(obj, root_rank, name, allow_pickle)


# ------------------------------------------------------------------ optimizer --



def _layout(sd: dict) -> dict:
    """What a rank needs to rebuild the root's optimizer state: tensor metadata and plain values."""
    groups = []
    for g in sd["param_groups"]:
        groups.append({k: v for k, v in g.items() if k != "params"} | {"__params__": len(g["params"])})
    state = {}
    for idx, st in sd["state"].items():
        entry = {}
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                entry[k] = {"__tensor__": [str(v.dtype), list(v.shape)]}
            else:
                entry[k] = {"__value__": v}
        state[str(idx)] = entry
    return {"groups": groups, "state": state}


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              prefix: str = "optimizer.", process_set=None) -> None:
    """Make every rank's optimizer state and hyperparameters equal to ``root_rank``'s.

    Works with CPU and GPU tensors, scalar entries such as ``step`` (tensor or
    number) and non-tensor entries. Ranks whose state is still empty (no step
    taken yet) get the root's layout first, then its values; if the root's own
    state is empty, every rank's state is emptied, which is what a fresh
    optimizer is. Unlike Horovod, no zero-gradient step is taken to create
    the state, so parameters and Adam's step count are never disturbed.
    The root's optimizer is not modified.
    """
    ops._need_init()
    _check_global(process_set)
    _check_root(root_rank)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state expects a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not _distributed():
        return
    is_root = ops.rank() == root_rank
    prefix = f"{KIND}.{prefix}"
    sd = optimizer.state_dict()
    layout = _layout(sd) if is_root else None
    data = _neutral.broadcast_bytes(_neutral.encode(layout, allow_pickle=True) if is_root else None, root_rank,
                                    prefix + "layout")
    if not is_root:
        try:  # plain data only: hyperparameters, shapes, numbers (no arbitrary unpickling)
            layout = _decode(data, allow_pickle=False, what="broadcast_optimizer_state")
        except Exception as e:  # noqa: BLE001
            raise BroadcastError(f"rank {ops.rank()}: cannot read the optimizer layout sent by root rank "
                                 f"{root_rank} (non-tensor state entries must be plain numbers, strings, "
                                 f"lists, tuples or dicts): {e}") from e

    mine = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [g["__params__"] for g in layout["groups"]]
    _neutral.agree(mine == theirs, "the optimizer's parameter groups",
                   f"parameters per group {mine}, root has {theirs}", prefix + "__agree__")

    params = [p for g in optimizer.param_groups for p in g["params"]]
    groups_of = [g_root for g_root, g in zip(layout["groups"], optimizer.param_groups) for _ in g["params"]]
    root_state = {int(k): v for k, v in layout["state"].items()}
    new_state: dict[int, dict] = {}
    transfers = []
    for idx in sorted(root_state):
        entry = {}
        for key, meta in root_state[idx].items():
            if "__value__" in meta:
                entry[key] = meta["__value__"]
                continue
            dtype, shape = dtypes.to_torch(meta["__tensor__"][0]), meta["__tensor__"][1]
            if is_root:
                t = sd["state"][idx][key]
            else:
                # where torch's own load_state_dict would put it: 'step' stays on the CPU
                # unless the group is capturable/fused, everything else goes to the parameter
                p, group = params[idx], groups_of[idx]
                on_param = key != "step" or group.get("capturable") or group.get("fused")
                t = torch.zeros(shape, dtype=dtype, device=p.device if on_param else "cpu")
            entry[key] = t
            transfers.append((f"{prefix}{idx}.{key}", t))
        new_state[idx] = entry
    _broadcast_many(transfers, root_rank)
    if is_root:
        return
    # assigned directly: torch's load_state_dict would turn string entries into garbage
    # (it treats every iterable as a container to cast element-wise)
    optimizer.state.clear()
    for idx, entry in new_state.items():
        optimizer.state[params[idx]] = entry
    for g, g_root in zip(optimizer.param_groups, layout["groups"]):
        g.update({k: v for k, v in g_root.items() if k not in ("__params__", "params")})
