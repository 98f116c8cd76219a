"""PyTorch binding, Horovod/BytePS-shaped: ``import pushpull.torch as bps``."""
from pushpull.torch.ops import (  # noqa: F401
    NotInitializedError, barrier, config, declare, engine, init, is_initialized, local_rank, local_size, poll,
    push_pull, push_pull_async, push_pull_async_inplace, push_pull_inplace, rank, shutdown, size, synchronize,
)
from pushpull.torch.compression import Compression  # noqa: F401
from pushpull.torch.optimizer import DistributedOptimizer  # noqa: F401
from pushpull.torch.functions import (  # noqa: F401
    BroadcastError, broadcast, broadcast_, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from pushpull.torch.ddp import (  # noqa: F401
    CommHookState, DistributedDataParallel, ddp_comm_hook, init_process_group_for_ddp,
)
from pushpull.worker.handle import PushPullError, WorkersChanged  # noqa: F401
from pushpull.torch import elastic  # noqa: F401
from pushpull.torch.ops import trace_step  # noqa: F401
from pushpull.torch.scheduled import ScheduledOptimizer  # noqa: F401
from pushpull.torch.autotune import AutoTuner  # noqa: F401
