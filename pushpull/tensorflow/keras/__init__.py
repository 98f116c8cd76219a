"""``import pushpull.tensorflow.keras as hvd``: Horovod's ``horovod.tensorflow.keras`` path, the same
module as :mod:`pushpull.keras` (Keras 3 is TensorFlow's Keras in TF 2.21)."""
from pushpull.keras import *  # noqa: F401,F403
from pushpull.keras import (  # noqa: F401
    Average, Compression, DistributedOptimizer, Sum, allreduce, broadcast, broadcast_global_variables,
    broadcast_object, broadcast_variables, callbacks, reduce_gradients,
)
