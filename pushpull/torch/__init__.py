"""PyTorch binding, Horovod/BytePS-shaped: ``import pushpull.torch as bps``."""
from pushpull.torch.ops import (  # noqa: F401
    NotInitializedError, barrier, config, declare, engine, init, is_initialized, local_rank, local_size, poll,
    push_pull, push_pull_async, push_pull_async_inplace, push_pull_inplace, rank, shutdown, size, synchronize,
)
from pushpull.torch.compression import Compression  # noqa: F401
from pushpull.torch.optimizer import DistributedOptimizer  # noqa: F401
from pushpull.worker.handle import PushPullError  # noqa: F401
