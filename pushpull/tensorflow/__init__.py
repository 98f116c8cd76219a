"""TensorFlow 2 binding, Horovod/BytePS-shaped: ``import pushpull.tensorflow as bps``.

Same engine, servers and wire format as :mod:`pushpull.torch` (tensors cross
as NumPy arrays); see docs/api.md for the API and the migration tables.
"""
from pushpull.tensorflow.ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, allreduce, barrier, broadcast, broadcast_global_variables,
    broadcast_object, broadcast_variables, distributed, grouped_allreduce, init, is_initialized, local_rank,
    local_size, push_pull, rank, reduce_many, shutdown, size,
)
from pushpull.worker.compression import Compression  # noqa: F401
from pushpull.tensorflow.tape import DistributedGradientTape  # noqa: F401
from pushpull.tensorflow.optimizer import BroadcastGlobalVariablesHook, DistributedOptimizer  # noqa: F401
from pushpull.keras.diloco import DiLoCo  # noqa: F401 - local SGD / DiLoCo over tf.Variable or Keras variables
from pushpull.worker.handle import PushPullError  # noqa: F401
from pushpull.worker.broadcast import BroadcastError  # noqa: F401
