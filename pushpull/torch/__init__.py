"""PyTorch binding, Horovod/BytePS-shaped: ``import pushpull.torch as bps`` (or ``as hvd``).

Public calls reject unknown keyword arguments naming the nearest valid one (:mod:`pushpull.torch.kwargs`)."""
from pushpull.torch.kwargs import checked as _checked
from pushpull.torch import ops as _ops, functions as _functions, collectives as _coll, gather as _gather
from pushpull.torch.ops import (  # noqa: F401
    NotInitializedError, config, engine, init, is_initialized, late_pushes, local_rank, local_size, poll, rank,
    shutdown, size, synchronize,
)
from pushpull.torch.compression import Compression, Compressor  # noqa: F401
from pushpull.torch.optimizer import DistributedOptimizer  # noqa: F401
from pushpull.torch.asynchronous import AsyncOptimizer  # noqa: F401
from pushpull.torch.diloco import DiLoCo  # noqa: F401
from pushpull.torch.sparse import SparseEmbedding  # noqa: F401
from pushpull.torch.functions import BroadcastError  # noqa: F401
from pushpull.torch.collectives import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, ReduceOp, Sum, add_process_set, ccl_built, cuda_built,
    ddl_built, global_process_set, gloo_built, gloo_enabled, join, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, remove_process_set, rocm_built,
)
from pushpull.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from pushpull.torch.ddp import (  # noqa: F401
    CommHookState, DistributedDataParallel, ddp_comm_hook, init_process_group_for_ddp,
)
from pushpull.worker.handle import PushPullError, WorkersChanged  # noqa: F401
from pushpull.torch import elastic  # noqa: F401
from pushpull.torch.ops import trace_step  # noqa: F401
from pushpull.torch.futures import get_future  # noqa: F401
from pushpull.torch.scheduled import ScheduledOptimizer  # noqa: F401
from pushpull.torch.autotune import AutoTuner  # noqa: F401

# BytePS's names
push_pull = _checked(_ops.push_pull)
push_pull_inplace = _checked(_ops.push_pull_inplace)
push_pull_async = _checked(_ops.push_pull_async)
push_pull_async_inplace = _checked(_ops.push_pull_async_inplace)
byteps_push_pull = push_pull_async_inplace  # BytePS's name for it (its own tests call it): a handle, in place
declare = _checked(_ops.declare)
# Horovod's names
allreduce = _checked(_coll.allreduce)
allreduce_ = _checked(_coll.allreduce_)
allreduce_async = _checked(_coll.allreduce_async)
allreduce_async_ = _checked(_coll.allreduce_async_)
grouped_allreduce = _checked(_coll.grouped_allreduce)
grouped_allreduce_ = _checked(_coll.grouped_allreduce_)
grouped_allreduce_async = _checked(_coll.grouped_allreduce_async)
grouped_allreduce_async_ = _checked(_coll.grouped_allreduce_async_)
allgather = _checked(_gather.allgather)
allgather_async = _checked(_gather.allgather_async)
allgather_object = _checked(_gather.allgather_object)
alltoall = _checked(_gather.alltoall)
alltoall_async = _checked(_gather.alltoall_async)
reducescatter = _checked(_gather.reducescatter)
reducescatter_async = _checked(_gather.reducescatter_async)
grouped_allgather = _checked(_gather.grouped_allgather)
grouped_allgather_async = _checked(_gather.grouped_allgather_async)
grouped_reducescatter = _checked(_gather.grouped_reducescatter)
grouped_reducescatter_async = _checked(_gather.grouped_reducescatter_async)
barrier = _checked(_coll.barrier)
broadcast = _checked(_functions.broadcast)
broadcast_ = _checked(_functions.broadcast_)
broadcast_async = _checked(_functions.broadcast_async)
broadcast_async_ = _checked(_functions.broadcast_async_)
broadcast_object = _checked(_functions.broadcast_object)
broadcast_parameters = _checked(_functions.broadcast_parameters)
broadcast_optimizer_state = _checked(_functions.broadcast_optimizer_state)
