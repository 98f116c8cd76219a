"""Low-level PyTorch API, shaped like Horovod's and BytePS's (``import
pushpull.torch as bps``): init, rank/size, push_pull and its async/in-place
variants, poll, synchronize, declare.

Horovod's module-level functions over the process's job context
(:mod:`pushpull.worker.context`, which every binding shares): this module adds
torch's types to its signatures and nothing else.

With one worker process and no ``BYTEPS_FORCE_DISTRIBUTED``, nothing is started
and push_pull is a local copy, so a training script runs unchanged alone.
"""
from __future__ import annotations

import torch

from pushpull.worker import trace as _trace
from pushpull.worker.context import (  # noqa: F401 - the API's names
    CONTEXT, GRADIENT, KIND, NotInitializedError, Pending, barrier, config, init, is_initialized, local_rank,
    local_size, rank, shutdown, size,
)
from pushpull.worker.engine import PLAIN, Engine, KeySpec
from pushpull.worker.handle import PushPullError  # noqa: F401

_state = CONTEXT  # the process's job context (pushpull.worker.context)


def _need_init():
    return CONTEXT.need_init()


_leave = CONTEXT.leave


def engine() -> Engine | None:
    """The communication engine, or None in single-process mode."""
    return CONTEXT.need_init().engine


def set_name_suffix(suffix: str) -> None:
    """Append ``suffix`` to every tensor name from the next operation on (the auto-tuner's new partition
    size: a key's partition layout is fixed at its INIT, so re-partitioned tensors need new keys)."""
    CONTEXT.name_suffix = suffix


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the servers hold a tensor of ``dtype`` in, and a seed is given in (pushpull.dtypes: half
    precisions in float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def set_seed(key: str, rnd: int, params, momentum=None) -> None:
    """The state a server-held key (an outer key, a store key) had after round ``rnd`` as this worker saw it
    (flat NumPy arrays in the key's accumulation dtype, not written again): a server the key moves to when
    its own is lost starts from the newest seed its workers give (no-op without an engine)."""
    eng = CONTEXT.need_init().engine
    if eng is not None:
        eng.set_seed(key + CONTEXT.name_suffix, rnd, params, momentum)


def get_seed(key: str):
    """The seed ``set_seed`` (or, for an outer key, each round's answer) left for ``key``: (round id,
    parameters, momentum or None), or None."""
    eng = CONTEXT.need_init().engine
    return None if eng is None else eng.table.seeds.get(key + CONTEXT.name_suffix)


key_name = CONTEXT.key_name
like = CONTEXT.like
release_key = CONTEXT.release_key
_register = CONTEXT.register
register_pending = CONTEXT.register_pending
late_pushes = CONTEXT.late_pushes
backup_spec = CONTEXT.backup_spec
poll = CONTEXT.poll
_handle_object = CONTEXT.handle_object
handle_name = CONTEXT.handle_name
describe = CONTEXT.describe
when_done = CONTEXT.when_done
_user_key = CONTEXT.user_key


def submit_key(tensor: torch.Tensor, output: torch.Tensor | None, average: bool, key: str, priority: int = 0,
               compression=None, spec: KeySpec = PLAIN, sig: int = 0, offset: int = 0) -> int:
    """Start one collective on the server-side name ``key`` (no name space added); returns a handle.
    The building block of every public call (see :class:`pushpull.worker.engine.KeySpec`)."""
    return CONTEXT.submit_key(tensor, output, average, key, priority, compression, spec, sig, offset)


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                    priority: int = 0, compression=None) -> int:
    """Start summing (or averaging) ``tensor`` over all workers into a new tensor; returns a handle.

    ``priority``: larger is more urgent. Integer averages are the sum divided by the number of workers,
    rounded toward zero (as C integer division). Its name on the servers is ``allreduce.<name>``
    (Horovod's allreduce shares the name space: both are user reductions)."""
    return CONTEXT.push_pull_async(tensor, None, average, name, priority, compression)


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                            version: int = 0, priority: int = 0, compression=None) -> int:
    return CONTEXT.push_pull_async(tensor, tensor, average, name, priority, compression)


def synchronize(handle: int, timeout: float | None = None) -> torch.Tensor:
    """Wait for ``handle`` and return its output; errors are raised here."""
    return CONTEXT.synchronize(handle, timeout)


def reduce_now(tensor: torch.Tensor, output: torch.Tensor | None, average: bool, key: str, compression=None,
               spec: KeySpec = PLAIN, sig: int = 0) -> torch.Tensor:
    """A blocking reduction of ``key``: on the caller's thread when the engine can (small, ready, plain;
    the server still checks ``sig``), else through the engine."""
    return CONTEXT.reduce_now(tensor, output, average, key, compression, spec, sig)


def push_pull(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
              priority: int = 0, compression=None) -> torch.Tensor:
    return CONTEXT.push_pull(tensor, None, average, name, compression)


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                      priority: int = 0, compression=None) -> torch.Tensor:
    return CONTEXT.push_pull(tensor, tensor, average, name, compression)


def declare(name: str, tensor: torch.Tensor | None = None) -> None:
    """Declare a tensor name ahead of use (BytePS API). Keys are agreed by name,
    so declaring is optional; with a tensor it fixes shape and dtype early."""
    CONTEXT.declare(name, tensor)


def trace_step() -> None:
    """Mark the end of a training step for the timeline (PUSHPULL_TRACE_ON).

    Optional: the optimizer wrappers' step() counts steps by itself; once this is
    called, only these calls count (for loops with several optimizers or none)."""
    _trace.step()
