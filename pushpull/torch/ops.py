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

import torch

from pushpull.config import Config, load_config, python_log_level, worker_identity
from pushpull.worker import trace as _trace
from pushpull.worker.engine import SUPPORTED, Engine
from pushpull.worker.handle import Handle, PushPullError

log = logging.getLogger("pushpull")


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
        self.noname = itertools.count()
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
    if config is None:
        from pushpull.launch import torchrun

        if torchrun.wanted():  # plain torchrun: start our own scheduler and servers (docs/api.md)
            torchrun.start_cluster()
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
        _state.engine = engine
        atexit.register(shutdown)
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
    """Leave the cluster: waits until every worker is done, then servers exit."""
    eng = _state.engine
    _state.engine = None
    _trace.uninstall()
    if eng is not None:
        if _state.crashed:
            eng.stop()  # crashed: exit now and let the launcher stop the job
        else:
            eng.shutdown()
    _state.cfg = None
    _state.handles.clear()


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


def _name(name: str | None) -> str:
    return name if name is not None else f"push_pull.noname.{next(_state.noname)}"


def _register(h: Handle) -> int:
    with _state.lock:
        hid = next(_state.ids)
        _state.handles[hid] = h
    return hid


def _compression_spec(compression) -> dict | None:
    if compression is None:
        return None
    spec = getattr(compression, "spec", compression)
    return spec or None


def _submit(tensor: torch.Tensor, output: torch.Tensor | None, average: bool, name: str | None,
            priority: int, compression) -> int:
    st = _need_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"push_pull expects a torch.Tensor, got {type(tensor).__name__}")
    name = _name(name) + st.name_suffix
    if st.engine is None:
        if tensor.dtype not in SUPPORTED:
            raise TypeError(f"push_pull of tensor {name!r}: dtype {tensor.dtype} is not supported")
        with st.lock:
            if name in st.local_names:
                raise ValueError(f"a push_pull of tensor {name!r} is already in flight; wait for it before "
                                 f"starting another with the same name")
            st.local_names.add(name)
        h = Handle(name, None)
        if output is None:
            h.output = tensor.detach().clone()
        else:
            if output.data_ptr() != tensor.data_ptr():
                output.copy_(tensor.detach())
            h.output = output
        h.complete()
        return _register(h)
    return _register(st.engine.submit(tensor, output, name, average, priority, _compression_spec(compression)))


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                    priority: int = 0, compression=None) -> int:
    """Start summing (or averaging) ``tensor`` over all workers into a new tensor; returns a handle.

    ``priority``: larger is more urgent. Integer averages are the sum divided by
    the number of workers, rounded toward zero (as C integer division).
    """
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


def synchronize(handle: int, timeout: float | None = None) -> torch.Tensor:
    """Wait for ``handle`` and return its output; errors are raised here."""
    with _state.lock:
        h = _state.handles.pop(handle, None)
    if h is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    eng = _state.engine
    if eng is None:
        with _state.lock:
            _state.local_names.discard(h.name)
        return h.wait(0.0)
    tr = _trace.current
    if tr is not None and not h.done():
        with tr.span("wait", f"wait {h.name}", cat="wait"):
            return eng.wait(h, timeout)
    return eng.wait(h, timeout)


def _direct(tensor, output, average: bool, name: str | None, compression) -> torch.Tensor | None:
    """The engine's caller-thread path for a small blocking call (None: take the usual one)."""
    st = _state
    if st.engine is None or name is None or compression is not None or not isinstance(tensor, torch.Tensor):
        return None
    return st.engine.push_pull_now(tensor, output, name + st.name_suffix, average)


def push_pull(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
              priority: int = 0, compression=None) -> torch.Tensor:
    out = _direct(tensor, None, average, name, compression)
    if out is not None:
        return out
    return synchronize(push_pull_async(tensor, average, name, version, priority, compression))


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                      priority: int = 0, compression=None) -> torch.Tensor:
    out = _direct(tensor, tensor, average, name, compression)
    if out is not None:
        return out
    return synchronize(push_pull_async_inplace(tensor, average, name, version, priority, compression))


def declare(name: str, tensor: torch.Tensor | None = None) -> None:
    """Declare a tensor name ahead of use (BytePS API). Keys are agreed by name,
    so declaring is optional; with a tensor it fixes shape and dtype early."""
    st = _need_init()
    if st.engine is not None and tensor is not None:
        st.engine.declare(name + st.name_suffix, tensor)


def trace_step() -> None:
    """Mark the end of a training step for the timeline (PUSHPULL_TRACE_ON).

    Optional: DistributedOptimizer.step() counts steps by itself; once this is
    called, only these calls count (for loops with several optimizers or none)."""
    _trace.step()


def barrier() -> None:
    """Wait until every worker reaches this point."""
    st = _need_init()
    if st.engine is not None:
        st.engine.barrier()
