"""Keras 3 binding, Horovod-shaped: ``import pushpull.keras as hvd`` (or ``pushpull.tensorflow.keras``).

``DistributedOptimizer`` and the callbacks in :mod:`pushpull.keras.callbacks`
work on Keras's tensorflow backend (the default) and its torch backend; see
docs/api.md for what differs from Horovod under Keras 3.
"""
from pushpull.worker.context import (  # noqa: F401
    barrier, init, is_initialized, local_rank, local_size, rank, shutdown, size,
)
from pushpull.worker.compression import Compression  # noqa: F401
from pushpull.keras import callbacks  # noqa: F401
from pushpull.keras.callbacks import broadcast_variables  # noqa: F401
from pushpull.keras.optimizer import DistributedOptimizer, reduce_gradients  # noqa: F401
from pushpull.keras.diloco import DiLoCo  # noqa: F401

Average = 0  # Horovod's op constants (pushpull.tensorflow.Average compares equal)
Sum = 1


def allreduce(value, name: str | None = None, average: bool = True, op=None):
    """Horovod's Keras ``allreduce`` of a value (a number, a NumPy array, a tensor): returns a NumPy array
    averaged (or summed) over all workers. Every rank must call it with the same ``name`` (or, unnamed,
    in the same order)."""
    import numpy as np
    import keras

    from pushpull.worker.context import CONTEXT

    if op is not None:
        average = int(op) == Average
        if int(op) not in (Average, Sum):
            raise NotImplementedError("op: pushpull supports Average and Sum")
    arr = np.array(keras.ops.convert_to_numpy(value), order="C", copy=True)
    return CONTEXT.push_pull(arr, None, average, name and "keras.allreduce." + name)


def broadcast(value, root_rank: int, name: str | None = None):
    """``root_rank``'s value (a NumPy array) on every rank, bit-exact."""
    import numpy as np
    import keras

    from pushpull.worker.broadcast import broadcast_array

    arr = np.array(keras.ops.convert_to_numpy(value), order="C", copy=True)
    return broadcast_array(arr, root_rank, name and "keras.broadcast." + name)


def broadcast_global_variables(root_rank: int):
    """Keras 3 keeps no global variable collection: broadcast the model's and the optimizer's variables
    (``BroadcastGlobalVariablesCallback`` does it for ``fit``)."""
    raise RuntimeError("Keras 3 has no global variable collection: use "
                       "pushpull.keras.broadcast_variables(model.variables + optimizer.variables, root_rank, "
                       "'prefix.') or callbacks.BroadcastGlobalVariablesCallback(root_rank)")


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, allow_pickle: bool | None = None):
    from pushpull.worker.broadcast import broadcast_object as _bo

    return _bo(obj, root_rank, name=name, allow_pickle=allow_pickle)
