"""The job context: what one worker process knows of its job, for every framework binding.

Why one object: the torch, TensorFlow, Keras and MXNet bindings are facades over the same job (one engine
per process, so a script may mix them), and each needs the same things: init and membership, the names its
tensors have on the servers (name spaces per operation, unnamed calls' agreement), handles, the one-process
shortcut. None of it needs a framework: tensors are torch tensors or NumPy arrays (worker/tensors.py), and
a process without torch runs all of it. :data:`CONTEXT` is the process's one instance; the bindings hold it
(``pushpull.torch.ops`` is Horovod's module-level API over it).
"""
from __future__ import annotations

import atexit
import itertools
import logging
import sys
import threading
import time
from typing import Callable

import numpy as np

from pushpull.dtypes import BY_NAME
from pushpull.config import Config, load_config, python_log_level, worker_identity
from pushpull.transport.protocol import round_sig
from pushpull.worker import trace as _trace
from pushpull.worker.compression import normalize
from pushpull.worker.engine import PLAIN, Engine, KeySpec
from pushpull.worker.handle import Handle, PushPullError
from pushpull.worker.tensors import describe as _describe_tensor
from pushpull.worker.tensors import kind_of

log = logging.getLogger("pushpull")
KIND = "allreduce"  # the name space of user reductions: push_pull, allreduce, grouped_allreduce
GRADIENT = "Gradient"  # DistributedOptimizer's, DistributedDataParallel's and the DDP comm hook's gradients
UINT8 = BY_NAME["uint8"]
_AGREE_BYTES = 96  # an unnamed key's name as every rank sees it, in one row of bytes per rank


class NotInitializedError(RuntimeError):
    pass


class Pending:
    """An operation made of several engine handles and a last step (decompress, scale, write back,
    reassemble), run by :meth:`JobContext.synchronize`; it quacks like a :class:`Handle`."""

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


def _leaves(h) -> list:
    """The engine handles an operation is made of (a Pending's parts may be Pendings)."""
    return [leaf for p in h.parts for leaf in _leaves(p)] if hasattr(h, "parts") else [h]


def _key_bytes(key: str) -> bytes:
    raw = key.encode()
    if len(raw) <= _AGREE_BYTES:
        return raw
    import zlib

    return raw[:_AGREE_BYTES - 9] + b"~" + f"{zlib.crc32(raw):08x}".encode()


def split_compression(compression) -> tuple[dict | None, object]:
    """(the wire spec, a Horovod-style compressor): at most one of them, from the compression in any form.
    Cheap for the forms the layers above hand down every step (None, a spec dict, a wire compressor); a
    name or a Horovod-style one goes through :func:`pushpull.worker.compression.normalize`, which checks it."""
    if compression is None:
        return None, None
    if isinstance(compression, dict):
        return compression or None, None
    if getattr(compression, "wire", False):
        return compression.spec or None, None
    c = normalize(compression)
    if c is None or getattr(c, "wire", False):
        return (c.spec if c is not None else None), None
    return None, c


class JobContext:
    """One worker process's view of its job (see the module's docstring)."""

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
        self.noname_agreed: set[str] = set()  # unnamed keys every rank said it uses (:meth:`_agree_unnamed`)
        self.noname_agreements = 0  # how many agreements this rank made: the agreement keys' numbers
        self.parked: Engine | None = None  # the engine after shutdown(): init() takes it up again
        self.lock = threading.Lock()
        self.local_names: set[str] = set()  # single-process mode: names not yet synchronized
        self.crashed = False  # an uncaught exception is on its way out
        # appended to every tensor name; the auto-tuner bumps it when it changes the partition size,
        # so re-partitioned tensors get new keys (pushpull.torch.autotune)
        self.name_suffix = ""

    # ------------------------------------------------------------------ membership --
    def need_init(self) -> "JobContext":
        if self.cfg is None:
            raise NotInitializedError("pushpull is not initialised: call init() first")
        return self

    def init(self, config: Config | None = None) -> None:
        """Join the cluster described by the environment (or ``config``).

        Registers with the scheduler, learns the servers and blocks until every worker and server has
        registered (or fails after PUSHPULL_TIMEOUT naming what is missing). Calling it twice is harmless."""
        if self.cfg is not None:
            return
        self.noname_busy.clear()  # unnamed calls are numbered from 0 again, on every rank alike
        self.noname_keys.clear()
        self.noname_agreed.clear()
        self.noname_agreements = 0
        if self.parked is not None and config is None:
            self.engine, self.parked = self.parked, None  # init() after shutdown(): the same membership
            self.cfg = self.engine.cfg
            self.rank, self.size = self.engine.rank, self.engine.size
            _trace.install(self.cfg, self.rank, self.engine)
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
        self.rank, self.size = ident.rank, ident.size
        self.local_rank, self.local_size = ident.local_rank, ident.local_size
        if ident.size > 1 or cfg.force_distributed:
            if cfg.num_server < 1:
                raise PushPullError(f"{ident.size} workers but DMLC_NUM_SERVER={cfg.num_server}: start at least "
                                    f"one server (pushpull launch --servers K)")
            engine = Engine(cfg, ident)
            engine.on_reset.append(self._on_workers_changed)
            engine.start()
            self.rank, self.size = engine.rank, engine.size  # a late worker of an elastic job: the job's
            self.engine = engine
            atexit.register(self.leave)
            self._watch_uncaught()
        self.cfg = cfg
        _trace.install(cfg, ident.rank, self.engine)

    def _on_workers_changed(self, rank: int, size: int) -> None:
        """Elastic training: the engine took a new rank and size (on its I/O thread)."""
        self.rank, self.size = rank, size

    def _watch_uncaught(self) -> None:
        """Remember an uncaught exception, so that the exit-time shutdown leaves at once: waiting for the
        other workers (who wait for this one) would hold the crash back from the launcher for PUSHPULL_TIMEOUT."""
        previous = sys.excepthook

        def hook(exc_type, exc, tb):
            self.crashed = True
            previous(exc_type, exc, tb)

        sys.excepthook = hook

    def shutdown(self) -> None:
        """Stop using pushpull in this process: collectives raise until ``init()`` is called again. With
        PUSHPULL_SHUTDOWN=leave (the default, BytePS's shutdown) the worker leaves the job, returning once
        every worker has finished (at most PUSHPULL_TIMEOUT), and the servers and scheduler end; with 'keep'
        (what pushpull's launchers set) it stays a member until the process exits and ``init()`` takes the
        same membership up again (Horovod's re-init)."""
        eng, cfg = self.engine, self.cfg
        self.engine = None
        _trace.uninstall()
        if eng is not None:
            if self.crashed:
                eng.stop()  # crashed: exit now and let the launcher stop the job
            elif cfg is not None and cfg.shutdown == "leave":
                eng.shutdown()
            else:
                self.parked = eng
        self.cfg = None
        self.handles.clear()

    def leave(self) -> None:
        """Leave the job now (at exit): waits until every worker is done, then servers exit."""
        self.shutdown()
        eng, self.parked = self.parked, None
        if eng is not None:
            if self.crashed:
                eng.stop()
            else:
                eng.shutdown()

    def barrier(self) -> None:
        """Wait until every worker reaches this point."""
        if self.need_init().engine is not None:
            self.engine.barrier()

    # ------------------------------------------------------------------ key names --
    def key_name(self, kind: str, name: str | None, like: str = "") -> str:
        """The name a tensor of operation ``kind`` has on the servers: ``<kind>.<name>``. Kinds never share
        a key: a gradient, a broadcast and a user's allreduce called ``fc.weight`` are three tensors.

        Unnamed calls get ``<kind>.noname.<like>.<slot>``: ``like`` says what the call moves (dtype, shape,
        op) and ``slot`` is the lowest one not held by an earlier unnamed call of the same kind and ``like``
        that was not synchronized yet. So names depend only on the program's order of calls and synchronizes
        (the same on every rank, as Horovod requires of unnamed calls), and a loop of unnamed blocking calls
        (a metric average per batch) reuses one key instead of declaring a new one on the servers every step."""
        if name is not None:
            return f"{kind}.{name}"
        with self.lock:
            busy = self.noname_busy.setdefault((kind, like), set())
            slot = 0
            while slot in busy:
                slot += 1
            busy.add(slot)
            key = f"{kind}.noname.{like + '.' if like else ''}{slot}"
            self.noname_keys[key] = (kind, like, slot)
        if like and self.engine is not None and key not in self.noname_agreed:
            try:
                self._agree_unnamed(key)
            except BaseException:
                self.release_key(key)  # nothing was pushed on it: the next unnamed call may take it
                raise
            self.noname_agreed.add(key)
        return key

    def _agree_unnamed(self, key: str) -> None:
        """The first use of an unnamed key: every rank says which key its call uses, on a key whose name
        does not depend on the call (the n-th agreement of every rank), before any data moves.

        Why: an unnamed call's key holds what it moves (dtype, shape, op), so ranks that disagree on the
        shape would wait on different keys until PUSHPULL_TIMEOUT, and the push of the one that gave up would
        stay on the servers for another rank's later call of that shape to sum (1 + 10 where 20 + 10 was
        due). Here every rank raises at once, naming each rank's key, and nothing was pushed. Once agreed, a
        key is used without asking again (a loop of unnamed metric averages pays this once)."""
        n, r = self.size, self.rank
        self.noname_agreements += 1
        table = np.zeros((n, _AGREE_BYTES), dtype=np.uint8)
        mine = _key_bytes(key)
        table[r, :len(mine)] = np.frombuffer(mine, dtype=np.uint8)
        name = f"noname.agree.{self.noname_agreements}.n{n}"
        table = self.reduce_now(table, None, False, name, spec=KeySpec(kind="noname"), sig=round_sig(average=False))
        said: dict[str, list[int]] = {}
        for k in range(n):
            row = bytes(np.asarray(table[k]).tobytes()).rstrip(b"\0")
            if row:  # a rank in join() gives an empty row: it takes no part
                said.setdefault(row.decode(errors="replace"), []).append(k)
        if len(said) > 1:
            detail = "; ".join(f"rank(s) {ks} use {text!r}" for text, ks in said.items())
            raise PushPullError(f"unnamed call {key!r} on rank {r}: the workers disagree on what it moves (an "
                                f"unnamed call's key holds its dtype, shape and op, so they would wait on different "
                                f"keys): {detail}. Make every rank pass the same dtype and shape, or name the call")

    @staticmethod
    def like(tensor, op: str = "sum") -> str:
        """What an unnamed call moves, for :meth:`key_name`: dtype, shape, and the op when not a sum."""
        text = _describe_tensor(tensor)
        return text if op == "sum" else f"{text}.{op}"

    def user_key(self, name: str | None, tensor) -> str:
        """A user reduction's key (push_pull, allreduce): ``allreduce.<name>``, or an unnamed one."""
        return self.key_name(KIND, name, self.like(tensor) if name is None and hasattr(tensor, "dtype") else "")

    def release_key(self, key: str) -> None:
        """An unnamed call's result was handed over: its slot is free for the next unnamed call."""
        if key.endswith(self.name_suffix) and self.name_suffix:
            key = key[:-len(self.name_suffix)]
        with self.lock:
            held = self.noname_keys.pop(key, None)
            if held is not None:
                self.noname_busy.get(held[:2], set()).discard(held[2])

    # ------------------------------------------------------------------ handles --
    def register(self, h) -> int:
        with self.lock:
            hid = next(self.ids)
            self.handles[hid] = h
        return hid

    def register_pending(self, name: str, handles: list[int], finish) -> int:
        """One handle for several started operations (their handles are taken over) and a last step."""
        with self.lock:
            parts = [self.handles.pop(h) for h in handles]
        return self.register(Pending(name, parts, finish))

    def handle_object(self, handle: int):
        with self.lock:
            h = self.handles.get(handle)
        if h is None:
            raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
        return h

    def poll(self, handle: int) -> bool:
        """True when the operation behind ``handle`` has finished (successfully or not)."""
        with self.lock:
            h = self.handles.get(handle)
        if h is None:
            raise ValueError(f"unknown handle {handle!r}")
        return h.done()

    def handle_name(self, handle: int) -> str:
        """The name (on the servers) of the tensor the operation behind ``handle`` moves."""
        return self.handle_object(handle).name

    def describe(self, handle: int) -> str:
        """What the operation behind ``handle`` waits for, for messages (the ranks the servers have not
        heard from, asked now); "finished" once it has."""
        try:
            h = self.handle_object(handle)
        except ValueError:
            return "finished (already synchronized)"
        if h.done():
            return "finished"
        texts = [p.describe() for p in _leaves(h) if not p.done()]
        return "; ".join(t for t in texts if t != "no reply") or "no reply"

    def when_done(self, handle: int, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the operation behind ``handle`` has finished, successfully or not: at once if
        it has, else on the thread that finishes it (the engine's I/O thread: keep ``fn`` short, and do not
        wait on other operations in it). ``synchronize(handle)`` then returns without blocking."""
        parts = _leaves(self.handle_object(handle))
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

    # ------------------------------------------------------------------ operations --
    def submit_key(self, tensor, output, average: bool, key: str, priority: int = 0, compression=None,
                   spec: KeySpec = PLAIN, sig: int = 0, offset: int = 0) -> int:
        """Start one collective on the server-side name ``key`` (no name space added); returns a handle.
        The building block of every public call (see :class:`pushpull.worker.engine.KeySpec`)."""
        self.need_init()
        try:
            kind_of(tensor)
        except TypeError as ex:  # the name formatted only here: this runs per tensor per step
            raise TypeError(f"{spec.kind} of {key!r}: {ex}") from None
        key = key + self.name_suffix
        spec_of, custom = split_compression(compression)
        if custom is not None:  # Horovod's way: reduce the compressed tensor, then decompress the result
            compressed, ctx = custom.compress(kind_of(tensor).detached(tensor))
            inner = self.submit_key(compressed, None, average, key, priority, None, spec, sig, offset)

            def finish(outs, output=output, ctx=ctx):
                result = custom.decompress(outs[0], ctx)
                if output is None:
                    return result
                kind_of(output).copy(output, result)
                return output
            return self.register_pending(key, [inner], finish)
        if self.engine is None:
            return self.register(self._submit_local(tensor, output, key, spec, offset))
        return self.register(self.engine.submit(tensor, output, key, average, priority, spec_of, spec, sig,
                                                offset))

    def _submit_local(self, tensor, output, key: str, spec: KeySpec, offset: int) -> Handle:
        """Single-process mode: the result of any collective over one worker, made here."""
        kind = kind_of(tensor)
        try:
            kind.dtype(tensor)
        except TypeError as ex:
            raise TypeError(f"push_pull of tensor {key!r}: {ex}") from None
        with self.lock:
            if key in self.local_names:
                raise ValueError(f"a push_pull of tensor {key!r} is already in flight; wait for it before "
                                 f"starting another with the same name")
            self.local_names.add(key)
        h = Handle(key, None)
        src = kind.detached(tensor)
        if spec.readers is not None and 0 not in spec.readers:
            h.output = None
        elif spec.op == "concat":
            h.output = output if output is not None else kind.zeros((spec.numel,), UINT8)
            h.output[offset:offset + kind.numel(src)] = src.reshape(-1)
        elif output is None:
            h.output = kind.clone(src)
        else:
            if not kind.same_memory(output, src):
                kind.copy(output, src)
            h.output = output
        h.complete()
        return h

    def synchronize(self, handle: int, timeout: float | None = None):
        """Wait for ``handle`` and return its output; errors are raised here."""
        with self.lock:
            h = self.handles.pop(handle, None)
        if h is None:
            raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
        eng = self.engine
        if eng is None:
            with self.lock:
                for part in getattr(h, "parts", (h,)):
                    self.local_names.discard(part.name)
            out = h.wait(0.0)
        else:
            tr = _trace.current
            if tr is not None and not h.done():
                with tr.span("wait", f"wait {h.name}", cat="wait"):
                    out = eng.wait(h, timeout)
            else:
                out = eng.wait(h, timeout)
        if self.noname_keys:  # a failed unnamed key keeps its slot: the next call takes another key
            self.release_key(h.name)
        return out

    def reduce_now(self, tensor, output, average: bool, key: str, compression=None, spec: KeySpec = PLAIN,
                   sig: int = 0):
        """A blocking reduction of ``key``: on the caller's thread when the engine can (small, ready, plain;
        the server still checks ``sig``), else through the engine."""
        self.need_init()
        if (self.engine is not None and compression is None and spec.op != "concat" and spec.readers is None
                and hasattr(tensor, "shape")):
            out = self.engine.direct_calls.push_pull_now(tensor, output, key + self.name_suffix, average, sig, spec)
            if out is not None:
                if self.noname_keys:  # a named key holds no slot
                    self.release_key(key)
                return out
        return self.synchronize(self.submit_key(tensor, output, average, key, 0, compression, spec, sig))

    def push_pull_async(self, tensor, output, average: bool, name: str | None, priority: int = 0,
                        compression=None) -> int:
        """Start a user reduction of ``tensor`` (into ``output``, or a new tensor); returns a handle."""
        if compression is not None:
            compression = normalize(compression, f"push_pull of {name!r}" if name else "an unnamed push_pull")
        return self.submit_key(tensor, output, average, self.user_key(name, tensor), priority, compression,
                               sig=round_sig(average=average))

    def push_pull(self, tensor, output, average: bool, name: str | None, compression=None):
        """A blocking user reduction of ``tensor`` (into ``output``, or a new tensor)."""
        if compression is not None:
            compression = normalize(compression, f"push_pull of {name!r}" if name else "an unnamed push_pull")
        return self.reduce_now(tensor, output, average, self.user_key(name, tensor), compression,
                               sig=round_sig(average=average))

    def declare(self, name: str, tensor=None) -> None:
        """Declare a tensor name ahead of use (BytePS API). Keys are agreed by name, so declaring is
        optional; with a tensor it fixes shape and dtype early."""
        if self.need_init().engine is not None and tensor is not None:
            self.engine.declare(self.key_name(KIND, name) + self.name_suffix, tensor)

    def late_pushes(self) -> dict[int, int]:
        """Backup workers (PUSHPULL_BACKUP_WORKERS): per rank, the gradient pushes the servers dropped
        because their round had completed without them (every partition counts; {} in a one-process job or
        with backup off)."""
        eng = self.need_init().engine
        return eng.status.late_pushes() if eng is not None else {}

    def backup_spec(self) -> KeySpec:
        """The key spec of an averaged gradient: with PUSHPULL_BACKUP_WORKERS=b > 0 its rounds complete with
        the first size() - b pushes (declared to the servers, which check that every worker says the same)."""
        b = self.need_init().cfg.backup_workers
        return KeySpec(meta=(("backup_workers", b),)) if b else PLAIN


CONTEXT = JobContext()  # the process's job: every binding holds this one


# Horovod's module-level basics over the process's context, for every binding to re-export
def init(config: Config | None = None) -> None:
    """Join the cluster described by the environment (or ``config``); see :meth:`JobContext.init`."""
    CONTEXT.init(config)


def shutdown() -> None:
    """Stop using pushpull in this process; see :meth:`JobContext.shutdown`."""
    CONTEXT.shutdown()


def is_initialized() -> bool:
    return CONTEXT.cfg is not None


def rank() -> int:
    return CONTEXT.need_init().rank


def size() -> int:
    return CONTEXT.need_init().size


def local_rank() -> int:
    return CONTEXT.need_init().local_rank


def local_size() -> int:
    return CONTEXT.need_init().local_size


def config() -> Config:
    return CONTEXT.need_init().cfg  # type: ignore[return-value]


def barrier() -> None:
    """Wait until every worker reaches this point."""
    CONTEXT.barrier()


def distributed() -> bool:
    """True when collectives leave the process (several workers, or BYTEPS_FORCE_DISTRIBUTED)."""
    return CONTEXT.need_init().size > 1 or CONTEXT.cfg.force_distributed
