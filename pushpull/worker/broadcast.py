"""Broadcasts over NumPy arrays: the part of every binding's broadcast that needs no framework.

A broadcast is a push_pull sum in which every rank but the root contributes zeros. The bits travel as an
integer view of the array (float32 as int32, float16 as int16, complex as pairs of its real type, ...), so
``0 + x`` is exact for every value, -0.0 and NaN payloads included, and the root's arrays are never
written. Every push carries the root rank and the dtype (the round signature), so ranks that disagree on
either fail together, told who gave what. ``pushpull.torch.functions`` adds torch's devices, autograd and
optimizer state on top; ``pushpull.tensorflow``, ``pushpull.keras`` and ``pushpull.mxnet`` use this
directly, and objects (``broadcast_object``) travel the same way for all of them.
"""
from __future__ import annotations

import io
import json
import zlib

import numpy as np

from pushpull.transport.protocol import round_sig
from pushpull.worker.context import CONTEXT, JobContext
from pushpull.worker.engine import KeySpec

KIND = "broadcast"
SPEC = KeySpec(kind=KIND)
# same-size integer dtype that carries an array's bits exactly through a sum with zeros
_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


class BroadcastError(RuntimeError):
    """The ranks disagree about what is being broadcast."""


def distributed(ctx: JobContext = CONTEXT) -> bool:
    return ctx.need_init().size > 1 or ctx.cfg.force_distributed


def check_root(root_rank: int, ctx: JobContext = CONTEXT) -> None:
    n = ctx.need_init().size
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool) or not 0 <= root_rank < n:
        raise ValueError(f"root_rank={root_rank!r} is not a rank of this job (size {n})")


def bits(a: np.ndarray) -> np.ndarray:
    """A contiguous integer view of ``a``'s bytes (a copy only if ``a`` is not contiguous)."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "c":
        a = a.reshape(-1).view(a.real.dtype)
    size = a.dtype.itemsize
    if size not in _BITS:
        raise TypeError(f"cannot broadcast dtype {a.dtype.name}")
    return a.reshape(-1).view(_BITS[size])


def broadcast_arrays(pairs: list[tuple[str, np.ndarray]], root_rank: int,
                     ctx: JobContext = CONTEXT) -> list[np.ndarray]:
    """``root_rank``'s value of every ``(key, array)`` pair, bit-exact; all in flight at once, under one
    deadline. The root gets its own arrays back; the others new arrays."""
    if not pairs:
        return []
    root = ctx.rank == root_rank
    handles = []
    for key, a in pairs:
        sig = round_sig(root=root_rank, dtype=a.dtype.name)
        b = bits(a)
        if not root:
            b = np.zeros_like(b)
        handles.append(ctx.submit_key(b, None if root else b, False, key, spec=SPEC, sig=sig))
    # one handle, so one deadline for them all (not PUSHPULL_TIMEOUT per array in turn), and every part
    # waited for even after a failure, so no handle is left behind
    outs = ctx.synchronize(ctx.register_pending(ctx.handle_name(handles[0]), handles, list))
    if root:
        return [a for _, a in pairs]
    return [np.asarray(out).view(a.dtype).reshape(a.shape) for (_, a), out in zip(pairs, outs)]


def agree(ok: bool, what: str, detail: str, name: str, ctx: JobContext = CONTEXT) -> None:
    """Every rank says whether it agrees with the root; all raise if any rank does not."""
    n = ctx.size
    flags = np.zeros(n, dtype=np.int32)
    if not ok:
        flags[ctx.rank] = 1
    # one flag per rank: the size is in the name
    flags = ctx.reduce_now(flags, None, False, f"{name}.n{n}", sig=round_sig(average=False))
    bad = [r for r in range(n) if int(flags[r])]
    if bad:
        mine = f"; this rank ({ctx.rank}): {detail}" if not ok else ""
        raise BroadcastError(f"{what} differs between the root and rank(s) {bad}{mine}")


def fingerprint(items: list[tuple[str, str, tuple]]) -> int:
    """``(name, dtype name, shape)`` of every tensor, as one number every rank compares with the root's."""
    return zlib.crc32(";".join(f"{n}:{d}:{list(s)}" for n, d, s in items).encode())


def broadcast_checked(pairs: list[tuple[str, np.ndarray]], root_rank: int, prefix: str,
                      ctx: JobContext = CONTEXT) -> list[np.ndarray]:
    """:func:`broadcast_arrays` of named arrays (keys ``broadcast.<prefix><name>``), after every rank checked
    that all hold the same set (names, dtypes, shapes): where one differs, every rank raises naming it,
    instead of waiting on keys the others never push."""
    base = f"{KIND}.{prefix}"
    fp = np.array([fingerprint([(n, a.dtype.name, a.shape) for n, a in pairs])], dtype=np.int64)
    got = broadcast_arrays([(base + "__fingerprint__", fp)], root_rank, ctx)[0]
    agree(bool(got[0] == fp[0]), "the set of tensors to broadcast (names, dtypes, shapes)",
          f"{len(pairs)} tensors: {[n for n, _ in pairs[:5]]}...", base + "__agree__", ctx)
    return broadcast_arrays([(base + n, a) for n, a in pairs], root_rank, ctx)


# ------------------------------------------------------------------ objects --

def encode(obj, allow_pickle: bool) -> bytes:
    """JSON when it round-trips exactly (types included), else torch.save (pickle-based; needs torch)."""
    try:
        text = json.dumps(obj, allow_nan=False, sort_keys=False)
        if json.loads(text) == obj and _same_types(json.loads(text), obj):
            return b"J" + text.encode()
    except (TypeError, ValueError, RecursionError):
        pass
    if not allow_pickle:
        raise TypeError(f"cannot send {type(obj).__name__} as JSON")
    try:
        import torch
    except ImportError:
        raise TypeError(f"broadcast_object: a {type(obj).__name__} does not travel as JSON, and anything else "
                        f"travels as torch.save bytes, which needs torch (pip install pushpull[torch])") from None
    buf = io.BytesIO()
    torch.save(obj, buf)
    return b"T" + buf.getvalue()


def _same_types(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return all(_same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return all(_same_types(a[k], b[k]) for k in a)
    return True


def decode(data: bytes, allow_pickle: bool, what: str = "broadcast_object"):
    """The receiver's policy picks the decoder, never the payload: JSON, or torch.load with
    ``weights_only`` (tensors, containers, numbers: no code runs) unless the receiver opted into pickle."""
    if data[:1] == b"J":
        try:
            return json.loads(data[1:].decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise BroadcastError(f"{what}: the root's JSON does not parse: {e}") from None
    if data[:1] == b"T":
        try:
            import torch
        except ImportError:
            raise BroadcastError(f"{what}: the root sent torch.save bytes, which need torch to load "
                                 f"(pip install pushpull[torch])") from None
        try:
            return torch.load(io.BytesIO(data[1:]), map_location="cpu", weights_only=not allow_pickle)
        except Exception as e:
            if allow_pickle:
                raise BroadcastError(f"{what}: the root's object does not load: {e}") from None
            raise BroadcastError(f"{what}: the root sent an object that needs pickle to rebuild (only tensors, "
                                 f"containers and numbers load safely); pass allow_pickle=True or set "
                                 f"PUSHPULL_ALLOW_PICKLE=1 on every rank if you trust every process that can join "
                                 f"the job ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    raise BroadcastError(f"{what} received bytes in an unknown format")


def broadcast_bytes(data: bytes | None, root_rank: int, name: str, ctx: JobContext = CONTEXT) -> bytes:
    """The root's ``data`` on every rank: its length first, then the bytes in a key of a few sizes (so the
    servers keep a few keys, not one per length)."""
    is_root = ctx.rank == root_rank
    length = np.array([len(data) if is_root else 0], dtype=np.int64)
    n = int(broadcast_arrays([(name + ".len", length)], root_rank, ctx)[0][0])
    cap = 1 << max(6, (n - 1).bit_length())
    buf = np.zeros(cap, dtype=np.uint8)
    if is_root:
        buf[:n] = np.frombuffer(data, dtype=np.uint8)
    out = broadcast_arrays([(f"{name}.bytes{cap}", buf)], root_rank, ctx)[0]
    return data if is_root else out[:n].tobytes()


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, allow_pickle: bool | None = None,
                     ctx: JobContext = CONTEXT):
    """Return ``root_rank``'s ``obj`` on every rank.

    JSON-able objects (that round-trip exactly) travel as JSON; anything else as ``torch.save`` bytes,
    which the other ranks load with ``weights_only=True``: tensors, dicts, lists, numbers and strings
    arrive, and no code from the wire runs. Objects that need pickle to rebuild (your own classes) need
    ``allow_pickle=True`` (or ``PUSHPULL_ALLOW_PICKLE=1``) on the receiving ranks; Horovod always
    unpickles (cloudpickle), docs/api.md says why we differ. The object travels as uint8 bytes.
    """
    check_root(root_rank, ctx)
    if not distributed(ctx):
        return obj
    name = name or "object"
    data = encode(obj, allow_pickle=True) if ctx.rank == root_rank else None
    out = broadcast_bytes(data, root_rank, f"{KIND}.{name}", ctx)
    if ctx.rank == root_rank:
        return obj
    if allow_pickle is None:
        allow_pickle = bool(ctx.cfg.allow_pickle)
    return decode(out, allow_pickle, f"broadcast_object {name!r}")


def broadcast_array(arr: np.ndarray, root_rank: int, name: str | None, ctx: JobContext = CONTEXT) -> np.ndarray:
    """Horovod's ``broadcast`` of one array: ``root_rank``'s value, under ``broadcast.<name>`` (or an
    unnamed key, numbered in call order like every unnamed call)."""
    check_root(root_rank, ctx)
    if not distributed(ctx):
        return arr
    key = ctx.key_name(KIND, name, ctx.like(arr) if name is None else "")
    return broadcast_arrays([(key, arr)], root_rank, ctx)[0]
