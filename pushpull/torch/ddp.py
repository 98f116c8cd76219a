"""Data-parallel modules over the parameter servers.

* :class:`DistributedDataParallel`: BytePS-style wrapper. Broadcasts the
  module's parameters and buffers from the root at construction, starts each
  gradient's push_pull from its autograd hook while backward is still running,
  and waits for all of them at the end of backward (a callback queued on the
  autograd engine), so ``loss.backward()`` returns averaged gradients and any
  plain optimizer can step. ``no_sync()`` accumulates locally instead.
* :func:`ddp_comm_hook`: a communication hook for PyTorch's own
  ``torch.nn.parallel.DistributedDataParallel``: DDP keeps its buckets,
  ordering and unused-parameter handling; the bucket goes through the
  parameter servers instead of the process group's all-reduce.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import socket
from datetime import timedelta

import torch

from pushpull.torch import ops
from pushpull.torch.compression import Compression
from pushpull.torch.functions import _broadcast_many, broadcast_object, broadcast_parameters
from pushpull.torch.futures import get_future

__all__ = ["DistributedDataParallel", "CommHookState", "ddp_comm_hook", "init_process_group_for_ddp"]

_wrappers = itertools.count()


def _distributed() -> bool:
    return ops.size() > 1 or ops.config().force_distributed


class DistributedDataParallel(torch.nn.Module):
    """Average gradients over all workers during ``backward()``.

    ``name``: prefix of this model's tensor names; defaults to ``ddp.<k>`` for
    the k-th wrapper built in this process (the same on every rank when
    every rank builds its wrappers in the same order). ``broadcast_buffers``:
    re-broadcast buffers (e.g. BatchNorm statistics) from ``root_rank`` at
    every training forward pass, as torch's DDP does; skipped in eval mode and
    under ``torch.no_grad()`` so that evaluating on one rank alone cannot hang.
    ``device_ids`` is accepted for torch compatibility and ignored.
    """

    def __init__(self, module: torch.nn.Module, device_ids=None, broadcast_buffers: bool = True,
                 compression=Compression.none, name: str | None = None, root_rank: int = 0):
        super().__init__()
        ops._need_init()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.root_rank = root_rank
        if isinstance(compression, str):
            compression = Compression.build(compression)
        self._compression = compression if compression is not None else Compression.none
        self._prefix = (name if name is not None else f"ddp.{next(_wrappers)}") + "."
        named = list(module.named_parameters())
        self._params = [(n, p) for n, p in named if p.requires_grad]
        self._priority = {p: -i for i, (_, p) in enumerate(self._params)}  # near the input = most urgent
        self._names = {p: n for n, p in self._params}
        self._require_sync = True
        self._handles: dict[torch.nn.Parameter, int] = {}
        self._callback_queued = False
        self._hooks = []
        broadcast_parameters(module.state_dict(), root_rank, prefix=self._prefix + "init.")
        if _distributed():
            for _, p in self._params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def forward(self, *args, **kwargs):
        if (self.broadcast_buffers and self.training and torch.is_grad_enabled() and _distributed()):
            bufs = [(ops.key_name("broadcast", self._prefix + "buf." + n), b)
                    for n, b in self.module.named_buffers()]
            if bufs:
                _broadcast_many(bufs, self.root_rank)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the first one after syncs the sum."""
        old, self._require_sync = self._require_sync, False
        try:
            yield
        finally:
            self._require_sync = old

    # ------------------------------------------------------------ hooks --
    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._require_sync:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
        self._submit(p)

    def _submit(self, p: torch.nn.Parameter) -> None:
        if p in self._handles:
            raise RuntimeError(f"gradient of {self._names[p]!r} is already being reduced")
        key = ops.key_name(ops.GRADIENT, self._prefix + self._names[p])
        self._handles[p] = ops.submit_key(p.grad, p.grad, True, key, self._priority[p], self._compression)

    def _on_backward_end(self) -> None:
        """End of backward: reduce parameters that got no gradient here (zeros, so that the
        ranks where they did are not left waiting), then wait for every reduction."""
        self._callback_queued = False
        try:
            for _, p in self._params:
                if p not in self._handles:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._submit(p)
        finally:
            handles, self._handles = self._handles, {}
            first_error = None
            for h in handles.values():
                try:
                    ops.synchronize(h)
                except Exception as e:  # noqa: BLE001
                    first_error = first_error or e
            if first_error is not None:
                raise first_error


# ------------------------------------------------------------------ comm hook --

class CommHookState:
    """State for :func:`ddp_comm_hook`: the model's name prefix (one per DDP model in a
    process), an optional compression, and the longest wait for a bucket (seconds)."""

    def __init__(self, name: str = "ddp_hook", compression=None, timeout: float | None = None):
        if isinstance(compression, str):
            compression = Compression.build(compression)
        self.name = name
        self.compression = compression
        self.timeout = timeout


def ddp_comm_hook(state, bucket) -> torch.futures.Future:
    """PyTorch DDP communication hook: average ``bucket.buffer()`` over all workers
    through the parameter servers.

    ``model.register_comm_hook(CommHookState("resnet"), pushpull.torch.ddp_comm_hook)``.
    ``state`` may also be a plain string (the name prefix) or None. Buckets are
    named by the prefix, ``bucket.index()`` and the bucket's size (DDP may rebuild
    its buckets after the first iteration, identically on every rank).
    """
    ops._need_init()
    if isinstance(state, CommHookState):
        prefix, compression, timeout = state.name, state.compression, state.timeout
    else:
        prefix, compression, timeout = (state if isinstance(state, str) else "ddp_hook"), None, None
    timeout = timeout or ops.config().timeout
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() != ops.size():
        raise RuntimeError(f"torch.distributed has world size {torch.distributed.get_world_size()} but pushpull "
                           f"has {ops.size()} workers; build the process group with init_process_group_for_ddp()")
    buf = bucket.buffer()
    name = f"{prefix}.bucket{bucket.index()}.n{buf.numel()}"
    # buckets nearer the input have larger indices and are the most urgent
    hid = ops.submit_key(buf, buf, True, ops.key_name(ops.GRADIENT, name), bucket.index(), compression)

    def into_bucket(fut: torch.futures.Future) -> torch.Tensor:
        out = fut.value()  # raises the operation's error, or the timeout's
        if out.data_ptr() != buf.data_ptr():
            buf.copy_(out)
        return buf

    return get_future(hid, timeout, what=f"DDP bucket {name!r}").then(into_bucket)


# torch's DDP checks the annotation object itself (not the string this module's
# ``from __future__ import annotations`` would leave)
ddp_comm_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def _local_address() -> str:
    cfg = ops.config()
    if cfg.node_host:
        return cfg.node_host
    if cfg.num_worker == 1:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def init_process_group_for_ddp(backend: str = "gloo", timeout: float | None = None) -> None:
    """Create the torch.distributed process group that PyTorch's DDP needs, from
    pushpull's rank and size (no torchrun needed).

    The rendezvous address is ``MASTER_ADDR:MASTER_PORT`` when both are set;
    otherwise rank 0 picks a free port on its own host and announces it to
    the others through pushpull, so nothing has to be agreed in advance.
    """
    import torch.distributed as dist

    ops._need_init()
    if dist.is_initialized():
        if dist.get_world_size() != ops.size() or dist.get_rank() != ops.rank():
            raise RuntimeError(f"a torch.distributed process group already exists with rank {dist.get_rank()}/"
                               f"{dist.get_world_size()}, but pushpull says {ops.rank()}/{ops.size()}")
        return
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port):
        mine = None
        if ops.rank() == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                mine = f"{_local_address()}:{s.getsockname()[1]}"
        addr, port = broadcast_object(mine, 0, name="ddp.rendezvous").rsplit(":", 1)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=ops.rank(), world_size=ops.size(),
                            timeout=timedelta(seconds=timeout or ops.config().timeout))
