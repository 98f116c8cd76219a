"""The two reduction backends as strategies see them: submit a tensor (averaged
in place over all workers), poll, wait. Strategies never touch the backends
directly, so every strategy runs unchanged over the parameter servers and over
torch.distributed all-reduce."""
from __future__ import annotations

import torch

from pushpull.torch import ops
from pushpull.worker.context import CONTEXT, GRADIENT, JobContext
from pushpull.worker.engine import PLAIN


class Comm:
    """Async in-place reduction. ``token`` is whatever ``submit`` returned."""

    backend = "none"

    def submit(self, tensor: torch.Tensor, name: str, priority: int, average: bool = True):
        raise NotImplementedError

    def wait(self, token) -> None:
        raise NotImplementedError

    def poll(self, token) -> bool:
        raise NotImplementedError

    def set_scheduling(self, partition_bytes: int, credit_bytes: int) -> None:
        """Partition size and credit (bytes; 0 = whole tensors / unlimited) for tensors used from now on."""

    def default_scheduling(self) -> tuple[int, int]:
        """(partition bytes, credit bytes) that strategies without scheduling use."""
        return 0, 0

    def scope(self):
        """What ``set_scheduling`` changes (shared by every Comm of the same engine)."""
        return id(self)

    def broadcast_from_root(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank ends with rank 0's values, bit for bit: the others contribute
        zeros to a sum (x + 0 is exact). Used to agree on measured plans."""
        if ops.rank() != 0:
            tensor.zero_()
        self.wait(self.submit(tensor, name, 0, average=False))
        return tensor


class PSComm(Comm):
    """push_pull through the parameter servers (priority and credit in the worker engine): it holds the job
    context and submits to it directly (docs/architecture.md, a gradient's way down)."""

    backend = "ps"

    def __init__(self, compression=None, ctx: JobContext = CONTEXT):
        self.compression = compression
        self.ctx = ctx

    def submit(self, tensor, name, priority, average=True):
        # gradients have a name space of their own on the servers (BytePS's "Gradient." prefix); averaged ones
        # may complete without the slowest workers (PUSHPULL_BACKUP_WORKERS), a broadcast never
        ctx = self.ctx
        return ctx.submit_key(tensor, tensor, average, ctx.key_name(GRADIENT, name), priority,
                              self.compression if average else None,
                              spec=ctx.backup_spec() if average else PLAIN)

    def wait(self, token) -> None:
        self.ctx.synchronize(token)

    def poll(self, token) -> bool:
        return self.ctx.poll(token)

    def set_scheduling(self, partition_bytes: int, credit_bytes: int) -> None:
        eng = self.ctx.need_init().engine
        if eng is not None:
            eng.set_scheduling(partition_bytes or None, credit_bytes)

    def scope(self):
        return ("ps", id(self.ctx.need_init().engine))

    def check_keys(self) -> None:
        """After the first step: the engine warns once if a hand-set key size gives too few keys per server."""
        eng = self.ctx.need_init().engine
        if eng is not None:
            eng.check_keys()

    def default_scheduling(self) -> tuple[int, int]:
        """BYTEPS_PARTITION_BYTES and BYTEPS_SCHEDULING_CREDIT in bytes (0 = credit off: FIFO;
        'auto' = its floor: one partition per server, at least two; the engine grows it to the measured
        bandwidth-delay product)."""
        cfg = self.ctx.need_init().cfg
        eng = self.ctx.engine
        if eng is not None:  # the engine's own: an optimizer may have fitted the key to the model
            return eng.cfg.partition_bytes, eng.default_credit_bytes(eng.cfg.partition_bytes)
        return cfg.partition_bytes, (cfg.scheduling_credit or 0) * cfg.partition_bytes


class AllreduceComm(Comm):
    """torch.distributed all-reduce through :mod:`pushpull.torch.allreduce_backend`."""

    backend = "allreduce"

    def __init__(self, compression=None):
        if compression:
            raise ValueError(f"compression {compression!r} is not available over the all-reduce backend (a sum of "
                             f"compressed tensors needs the server's decompress-sum-recompress); use "
                             f"PUSHPULL_BACKEND=ps or no compression")
        from pushpull.torch import allreduce_backend as allreduce

        self.reducer = allreduce.get_reducer()

    def submit(self, tensor, name, priority, average=True):
        return self.reducer.submit(tensor, name, priority, average=average)

    def wait(self, token) -> None:
        self.reducer.wait(token)

    def poll(self, token) -> bool:
        return token.done()

    def set_scheduling(self, partition_bytes: int, credit_bytes: int) -> None:
        self.reducer.set_scheduling(partition_bytes, credit_bytes)

    def scope(self):
        return ("allreduce", id(self.reducer))


def make_comm(backend: str | None = None, compression=None) -> Comm:
    backend = backend or ops.config().backend
    if backend == "ps":
        return PSComm(compression)
    if backend == "allreduce":
        return AllreduceComm(compression)
    raise ValueError(f"unknown backend {backend!r}; PUSHPULL_BACKEND accepts ps | allreduce")
