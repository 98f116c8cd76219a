"""Low-level PyTorch API, shaped like Horovod's and BytePS's (``import
pushpull.torch as bps``): init, rank/size, push_pull and its async/in-place
variants, poll, synchronize, declare.

With one worker process and no ``BYTEPS_FORCE_DISTRIBUTED``, nothing is started
and push_pull is a local copy, so a training script runs unchanged alone.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import sys
import threading
import time
from typing import Callable

import torch

from pushpull.config import Config, load_config, python_log_level, worker_identity
from pushpull.worker import trace as _trace
from pushpull.transport.protocol import round_sig
from pushpull.worker.engine import PLAIN, SUPPORTED, Engine, KeySpec
from pushpull.worker.handle import Handle, PushPullError

log = logging.getLogger("pushpull")
KIND = "allreduce"  # the name space of user reductions: push_pull, allreduce, grouped_allreduce
GRADIENT = "Gradient"  # DistributedOptimizer's, DistributedDataParallel's and the DDP comm hook's gradients


class _State:
    def __init__(self) -> None:
        self.cfg: Config | None = None
        self.engine: Engine | None = None
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.handles: dict[int, Handle] = {}
        self.ids = itertools.count(1)
        self.noname_busy: dict[tuple, set] = {}  # (kind, signature) -> slots of unnamed calls not yet synchronized
        self.noname_keys: dict[str, tuple] = {}  # an unnamed call's key -> (kind, signature, slot)
        self.noname_agreed: set[str] = set()  # unnamed keys every rank said it uses (:func:`_agree_unnamed`)
        self.noname_agreements = 0  # how many agreements this rank made: the agreement keys' numbers
        self.parked: Engine | None = None  # the engine after shutdown(): init() takes it up again
        self.lock = threading.Lock()
        self.local_names: set[str] = set()  # single-process mode: names not yet synchronized
        self.crashed = False  # an uncaught exception is on its way out
        # appended to every tensor name; the auto-tuner bumps it when it changes the partition size,
        # so re-partitioned tensors get new keys (pushpull.torch.autotune)
        self.name_suffix = ""


_state = _State()


class NotInitializedError(RuntimeError):
    pass


def _need_init() -> _State:
    if _state.cfg is None:
        raise NotInitializedError("pushpull is not initialised: call pushpull.torch.init() first")
    return _state


def init(config: Config | None = None) -> None:
    """Join the cluster described by the environment (or ``config``).

    Registers with the scheduler, learns the servers and blocks until every
    worker and server has registered (or fails after PUSHPULL_TIMEOUT naming
    what is missing). Calling it twice is harmless.
    """
    if _state.cfg is not None:
        return
    _state.noname_busy.clear()  # unnamed calls are numbered from 0 again, on every rank alike
    _state.noname_keys.clear()
    _state.noname_agreed.clear()
    _state.noname_agreements = 0
    if _state.parked is not None and config is None:
        _state.engine, _state.parked = _state.parked, None  # init() after shutdown(): the same membership
        _state.cfg = _state.engine.cfg
        _state.rank, _state.size = _state.engine.rank, _state.engine.size
        _trace.install(_state.cfg, _state.rank, _state.engine)
        return
    if config is None:
        from pushpull.launch import torchrun

        if torchrun.wanted():  # plain torchrun: start our own scheduler and servers (docs/api.md)
            torchrun.start_cluster()
        else:
            from pushpull.launch import hpc

            if hpc.which():  # srun or mpirun: the same (docs/integrations.md)
                hpc.start_cluster()
    cfg = config or load_config()
    logging.basicConfig(level=python_log_level(cfg), format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    logging.getLogger("pushpull").setLevel(python_log_level(cfg))
    ident = worker_identity(cfg)
    _state.rank, _state.size = ident.rank, ident.size
    _state.local_rank, _state.local_size = ident.local_rank, ident.local_size
    if ident.size > 1 or cfg.force_distributed:
        if cfg.num_server < 1:
            raise PushPullError(f"{ident.size} workers but DMLC_NUM_SERVER={cfg.num_server}: start at least one "
                                f"server (pushpull launch --servers K)")
        engine = Engine(cfg, ident)
        engine.on_reset.append(_on_workers_changed)
        engine.start()
        _state.rank, _state.size = engine.rank, engine.size  # a late worker of an elastic job: the job's
        _state.engine = engine
        atexit.register(_leave)
        _watch_uncaught()
    _state.cfg = cfg
    _trace.install(cfg, ident.rank, _state.engine)


def _on_workers_changed(rank: int, size: int) -> None:
    """Elastic training: the engine took a new rank and size (on its I/O thread)."""
    _state.rank, _state.size = rank, size


def _watch_uncaught() -> None:
    """Remember an uncaught exception, so that the exit-time shutdown leaves at once:
    waiting for the other workers (who wait for this one) would hold the crash back
    from the launcher for PUSHPULL_TIMEOUT."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        _state.crashed = True
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def shutdown() -> None:
    """Stop using pushpull in this process: collectives raise until ``init()`` is called again. With
    PUSHPULL_SHUTDOWN=leave (the default, BytePS's shutdown) the worker leaves the job, returning once every
    worker has finished (at most PUSHPULL_TIMEOUT), and the servers and scheduler end; with 'keep' (what
    pushpull's launchers set) it stays a
    member until the process exits and ``init()`` takes the same membership up again (Horovod's re-init)."""
    eng, cfg = _state.engine, _state.cfg
    _state.engine = None
    _trace.uninstall()
    if eng is not None:
        if _state.crashed:
            eng.stop()  # crashed: exit now and let the launcher stop the job
        elif cfg is not None and cfg.shutdown == "leave":
            eng.shutdown()
        else:
            _state.parked = eng
    _state.cfg = None
    _state.handles.clear()


def _leave() -> None:
    """Leave the job now (at exit): waits until every worker is done, then servers exit."""
    shutdown()
    eng, _state.parked = _state.parked, None
    if eng is not None:
        if _state.crashed:
            eng.stop()
        else:
            eng.shutdown()


def is_initialized() -> bool:
    return _state.cfg is not None


def rank() -> int:
    return _need_init().rank


def size() -> int:
    return _need_init().size


def local_rank() -> int:
    return _need_init().local_rank


def local_size() -> int:
    return _need_init().local_size


def config() -> Config:
    return _need_init().cfg  # type: ignore[return-value]


def engine() -> Engine | None:
    """The communication engine, or None in single-process mode."""
    return _need_init().engine


def set_name_suffix(suffix: str) -> None:
    """Append ``suffix`` to every tensor name from the next operation on (the auto-tuner's new partition
    size: a key's partition layout is fixed at its INIT, so re-partitioned tensors need new keys)."""
    _state.name_suffix = suffix


def key_name(kind: str, name: str | None, like: str = "") -> str:
    """The name a tensor of operation ``kind`` has on the servers: ``<kind>.<name>``. Kinds never share a
    key: a gradient, a broadcast and a user's allreduce called ``fc.weight`` are three tensors.

    Unnamed calls get ``<kind>.noname.<like>.<slot>``: ``like`` says what the call moves (dtype, shape, op)
    and ``slot`` is the lowest one not held by an earlier unnamed call of the same kind and ``like`` that
    was not synchronized yet. So names depend only on the program's order of calls and synchronizes (the
    same on every rank, as Horovod requires of unnamed calls), and a loop of unnamed blocking calls (a metric
    average per batch) reuses one key instead of declaring a new one on the servers every step."""
    if name is not None:
        return f"{kind}.{name}"
    with _state.lock:
        busy = _state.noname_busy.setdefault((kind, like), set())
        slot = 0
        while slot in busy:
            slot += 1
        busy.add(slot)
        key = f"{kind}.noname.{like + '.' if like else ''}{slot}"
        _state.noname_keys[key] = (kind, like, slot)
    if like and _state.engine is not None and key not in _state.noname_agreed:
        try:
            _agree_unnamed(key)
        except BaseException:
            release_key(key)  # nothing was pushed on it: the next unnamed call may take it
            raise
        _state.noname_agreed.add(key)
    return key


_AGREE_BYTES = 96  # an unnamed key's name as every rank sees it, in one row of bytes per rank


def _key_bytes(key: str) -> bytes:
    raw = key.encode()
    if len(raw) <= _AGREE_BYTES:
        return raw
    import zlib

    return raw[:_AGREE_BYTES - 9] + b"~" + f"{zlib.crc32(raw):08x}".encode()


def _agree_unnamed(key: str) -> None:
    """The first use of an unnamed key: every rank says which key its call uses, on a key whose name does
    not depend on the call (the n-th agreement of every rank), before any data moves.

    Why: an unnamed call's key holds what it moves (dtype, shape, op), so ranks that disagree on the shape
    would wait on different keys until PUSHPULL_TIMEOUT, and the push of the one that gave up would stay on
    the servers for another rank's later call of that shape to sum (1 + 10 where 20 + 10 was due). Here every
    rank raises at once, naming each rank's key, and nothing was pushed. Once agreed, a key is used without
    asking again (a loop of unnamed metric averages pays this once)."""
    st = _state
    n, r = st.size, st.rank
    st.noname_agreements += 1
    table = torch.zeros(n, _AGREE_BYTES, dtype=torch.uint8)
    mine = _key_bytes(key)
    table[r, :len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    name = f"noname.agree.{st.noname_agreements}.n{n}"
    table = reduce_now(table, None, False, name, spec=KeySpec(kind="noname"), sig=round_sig(average=False))
    said: dict[str, list[int]] = {}
    for k in range(n):
        row = bytes(table[k].tolist()).rstrip(b"\0")
        if row:  # a rank in join() gives an empty row: it takes no part
            said.setdefault(row.decode(errors="replace"), []).append(k)
    if len(said) > 1:
        detail = "; ".join(f"rank(s) {ks} use {text!r}" for text, ks in said.items())
        raise PushPullError(f"unnamed call {key!r} on rank {r}: the workers disagree on what it moves (an unnamed "
                            f"call's key holds its dtype, shape and op, so they would wait on different keys): "
                            f"{detail}. Make every rank pass the same dtype and shape, or name the call")


def like(tensor: torch.Tensor, op: str = "sum") -> str:
    """What an unnamed call moves, for :func:`key_name`: dtype, shape, and the op when not a sum."""
    text = f"{str(tensor.dtype).replace('torch.', '')}[{','.join(map(str, tensor.shape))}]"
    return text if op == "sum" else f"{text}.{op}"


def release_key(key: str) -> None:
    """An unnamed call's result was handed over: its slot is free for the next unnamed call."""
    if key.endswith(_state.name_suffix) and _state.name_suffix:
        key = key[:-len(_state.name_suffix)]
    with _state.lock:
        held = _state.noname_keys.pop(key, None)
        if held is not None:
            _state.noname_busy.get(held[:2], set()).discard(held[2])


def _register(h) -> int:
    with _state.lock:
        hid = next(_state.ids)
        _state.handles[hid] = h
    return hid


class Pending:
    """An operation made of several engine handles and a last step (decompress, scale, write back,
    reassemble), run by :func:`synchronize`; it quacks like a :class:`Handle`."""

    __slots__ = ("name", "parts", "finish")

    def __init__(self, name: str, parts: list, finish):
        self.name = name
        self.parts = parts
        self.finish = finish  # fn(list of the parts' outputs) -> the result

    def done(self) -> bool:
        return all(h.done() for h in self.parts)

    def abandon(self, why: str) -> None:
        for h in self.parts:
            h.abandon(why)

    def _collect(self, wait, timeout: float):
        """Every part within one deadline for the whole operation (not one per part in turn: a grouped
        allreduce of 5 tensors with a rank missing fails after ``timeout``, not 5 x ``timeout``)."""
        outs, error = [], None
        deadline = time.monotonic() + timeout
        for h in self.parts:  # wait for all, even after a failure, so none is left behind
            left = deadline - time.monotonic()
            if left <= 0 and error is not None and not h.done():
                h.abandon(str(error))  # the deadline passed and the error names what was missing: given up too
                continue
            try:
                outs.append(wait(h, max(left, 0.0)))
            except Exception as e:  # noqa: BLE001
                error = error or e
        if error is not None:
            raise error
        return self.finish(outs)

    def wait(self, timeout: float):
        return self._collect(lambda h, left: h.wait(left), timeout)

    def wait_alive(self, timeout: float, failure, op: str = "push_pull", limit: float | None = None):
        said = timeout if limit is None else limit  # the whole operation's deadline, for messages
        return self._collect(lambda h, left: h.wait_alive(left, failure, op, limit=said), timeout)


def register_pending(name: str, handles: list[int], finish) -> int:
    """One handle for several started operations (their handles are taken over) and a last step."""
    with _state.lock:
        parts = [_state.handles.pop(h) for h in handles]
    return _register(Pending(name, parts, finish))


def _compression_spec(compression) -> dict | None:
    if compression is None:
        return None
    spec = getattr(compression, "spec", compression)
    return spec or None


def _custom(compression):
    """A Horovod-style compressor (``compress``/``decompress``, no wire spec), applied on this worker."""
    if compression is None or isinstance(compression, dict) or getattr(compression, "wire", False):
        return None
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression={compression!r} is neither a pushpull compression (Compression.none, "
                        f"Compression.fp16, Compression.build(...)) nor a Horovod-style compressor with "
                        f"compress(tensor) -> (tensor, ctx) and decompress(tensor, ctx) -> tensor")
    return compression


def _submit_local(tensor, output, key: str, spec: KeySpec, offset: int) -> Handle:
    """Single-process mode: the result of any collective over one worker, made here."""
    st = _state
    if tensor.dtype not in SUPPORTED:
        raise TypeError(f"push_pull of tensor {key!r}: dtype {tensor.dtype} is not supported")
    with st.lock:
        if key in st.local_names:
            raise ValueError(f"a push_pull of tensor {key!r} is already in flight; wait for it before "
                             f"starting another with the same name")
        st.local_names.add(key)
    h = Handle(key, None)
    if spec.readers is not None and 0 not in spec.readers:
        h.output = None
    elif spec.op == "concat":
        h.output = output if output is not None else torch.zeros(spec.numel, dtype=torch.uint8)
        h.output[offset:offset + tensor.numel()] = tensor.detach().reshape(-1)
    elif output is None:
        h.output = tensor.detach().clone()
    else:
        if output.data_ptr() != tensor.data_ptr():
            output.copy_(tensor.detach())
        h.output = output
    h.complete()
    return h


def late_pushes() -> dict[int, int]:
    """Backup workers (PUSHPULL_BACKUP_WORKERS): per rank, the gradient pushes the servers dropped because their
    round had completed without them (every partition counts; {} in a one-process job or with backup off)."""
    eng = _need_init().engine
    return eng.late_pushes() if eng is not None else {}


def backup_spec() -> KeySpec:
    """The key spec of an averaged gradient: with PUSHPULL_BACKUP_WORKERS=b > 0 its rounds complete with the
    first size() - b pushes (declared to the servers, which check that every worker says the same)."""
    b = config().backup_workers
    return KeySpec(meta=(("backup_workers", b),)) if b else PLAIN


def submit_key(tensor: torch.Tensor, output: torch.Tensor | None, average: bool, key: str, priority: int = 0,
               compression=None, spec: KeySpec = PLAIN, sig: int = 0, offset: int = 0) -> int:
    """Start one collective on the server-side name ``key`` (no name space added); returns a handle.
    The building block of every public call (see :class:`pushpull.worker.engine.KeySpec`)."""
    st = _need_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{spec.kind} of {key!r} expects a torch.Tensor, got {type(tensor).__name__}")
    key = key + st.name_suffix
    custom = _custom(compression)
    if custom is not None:  # Horovod's way: reduce the compressed tensor, then decompress the result
        compressed, ctx = custom.compress(tensor.detach())
        inner = submit_key(compressed, None, average, key, priority, None, spec, sig, offset)

        def finish(outs, output=output, ctx=ctx):
            result = custom.decompress(outs[0], ctx)
            if output is None:
                return result
            output.copy_(result)
            return output
        return register_pending(key, [inner], finish)
    if st.engine is None:
        return _register(_submit_local(tensor, output, key, spec, offset))
    return _register(st.engine.submit(tensor, output, key, average, priority, _compression_spec(compression),
                                      spec, sig, offset))


def _submit(tensor: torch.Tensor, output: torch.Tensor | None, average: bool, name: str | None,
            priority: int, compression) -> int:
    key = key_name(KIND, name, like(tensor) if name is None and isinstance(tensor, torch.Tensor) else "")
    return submit_key(tensor, output, average, key, priority, compression, sig=round_sig(average=average))


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                    priority: int = 0, compression=None) -> int:
    """Start summing (or averaging) ``tensor`` over all workers into a new tensor; returns a handle.

    ``priority``: larger is more urgent. Integer averages are the sum divided by the number of workers,
    rounded toward zero (as C integer division). Its name on the servers is ``allreduce.<name>``
    (Horovod's allreduce shares the name space: both are user reductions)."""
    return _submit(tensor, None, average, name, priority, compression)


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                            version: int = 0, priority: int = 0, compression=None) -> int:
    return _submit(tensor, tensor, average, name, priority, compression)


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (successfully or not)."""
    with _state.lock:
        h = _state.handles.get(handle)
    if h is None:
        raise ValueError(f"unknown handle {handle!r}")
    return h.done()


def _handle_object(handle: int):
    with _state.lock:
        h = _state.handles.get(handle)
    if h is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    return h


def _leaves(h) -> list:
    """The engine handles an operation is made of (a Pending's parts may be Pendings)."""
    return [leaf for p in h.parts for leaf in _leaves(p)] if hasattr(h, "parts") else [h]


def handle_name(handle: int) -> str:
    """The name (on the servers) of the tensor the operation behind ``handle`` moves."""
    return _handle_object(handle).name


def describe(handle: int) -> str:
    """What the operation behind ``handle`` waits for, for messages (the ranks the servers have not heard
    from, asked now); "finished" once it has."""
    try:
        h = _handle_object(handle)
    except ValueError:
        return "finished (already synchronized)"
    if h.done():
        return "finished"
    texts = [p._describe() for p in _leaves(h) if not p.done() and p._describe is not None]
    return "; ".join(texts) or "no reply"


def when_done(handle: int, fn: Callable[[], None]) -> None:
    """Call ``fn()`` once the operation behind ``handle`` has finished, successfully or not: at once if it
    has, else on the thread that finishes it (the engine's I/O thread: keep ``fn`` short, and do not wait
    on other operations in it). ``synchronize(handle)`` then returns without blocking."""
    parts = _leaves(_handle_object(handle))
    if not parts:
        fn()
        return
    left = [len(parts)]
    lock = threading.Lock()

    def one_done(_h=None) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            fn()

    for p in parts:
        p.add_done_callback(one_done)


def synchronize(handle: int, timeout: float | None = None) -> torch.Tensor:
    """Wait for ``handle`` and return its output; errors are raised here."""
    with _state.lock:
        h = _state.handles.pop(handle, None)
    if h is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    eng = _state.engine
    if eng is None:
        with _state.lock:
            for part in getattr(h, "parts", (h,)):
                _state.local_names.discard(part.name)
        out = h.wait(0.0)
    else:
        tr = _trace.current
        if tr is not None and not h.done():
            with tr.span("wait", f"wait {h.name}", cat="wait"):
                out = eng.wait(h, timeout)
        else:
            out = eng.wait(h, timeout)
    if _state.noname_keys:  # a failed unnamed key keeps its slot: the next call takes another key
        release_key(h.name)
    return out


def reduce_now(tensor: torch.Tensor, output: torch.Tensor | None, average: bool, key: str, compression=None,
               spec: KeySpec = PLAIN, sig: int = 0) -> torch.Tensor:
    """A blocking reduction of ``key``: on the caller's thread when the engine can (small, ready, plain;
    the server still checks ``sig``), else through the engine."""
    st = _need_init()
    if (st.engine is not None and compression is None and isinstance(tensor, torch.Tensor)
            and spec.op != "concat" and spec.readers is None):
        out = st.engine.push_pull_now(tensor, output, key + st.name_suffix, average, sig, spec)
        if out is not None:
            if st.noname_keys:  # a named key holds no slot
                release_key(key)
            return out
    return synchronize(submit_key(tensor, output, average, key, 0, compression, spec, sig))


def _user_key(name: str | None, tensor) -> str:
    return key_name(KIND, name, like(tensor) if name is None and isinstance(tensor, torch.Tensor) else "")


def push_pull(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
              priority: int = 0, compression=None) -> torch.Tensor:
    return reduce_now(tensor, None, average, _user_key(name, tensor), compression, sig=round_sig(average=average))


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                      priority: int = 0, compression=None) -> torch.Tensor:
    return reduce_now(tensor, tensor, average, _user_key(name, tensor), compression,
                      sig=round_sig(average=average))


def declare(name: str, tensor: torch.Tensor | None = None) -> None:
    """Declare a tensor name ahead of use (BytePS API). Keys are agreed by name,
    so declaring is optional; with a tensor it fixes shape and dtype early."""
    st = _need_init()
    if st.engine is not None and tensor is not None:
        st.engine.declare(key_name(KIND, name) + st.name_suffix, tensor)


def trace_step() -> None:
    """Mark the end of a training step for the timeline (PUSHPULL_TRACE_ON).

    Optional: the optimizer wrappers' step() counts steps by itself; once this is
    called, only these calls count (for loops with several optimizers or none)."""
    _trace.step()


def barrier() -> None:
    """Wait until every worker reaches this point."""
    st = _need_init()
    if st.engine is not None:
        st.engine.barrier()
