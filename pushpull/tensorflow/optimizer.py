"""``DistributedOptimizer`` where TensorFlow 2.21 still has a place for one, and the TF1 session hook.

TF 2.21's ``tf.keras.optimizers`` are Keras 3 optimizers: those are wrapped by
:func:`pushpull.keras.DistributedOptimizer` (``apply`` reduces the gradients).
The TF1 ``tf.compat.v1.train.Optimizer`` family still exists for graph/session
code: its wrapper reduces inside ``compute_gradients``, as Horovod's did, so
``minimize()`` works unchanged. The legacy ``tf.keras`` (Keras 2) optimizers
are gone from TF 2.21 (only the separate ``tf_keras`` package has them) and
are not supported.
"""
from __future__ import annotations

import tensorflow as tf

from pushpull.tensorflow import ops as _ops
from pushpull.worker.compression import Compression


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer whose ``compute_gradients`` returns gradients reduced over all workers."""

    def __init__(self, optimizer, name, compression, average: bool):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=False)
        self._optimizer = optimizer
        self._pp_compression = compression
        self._pp_average = average
        self._pp_prefix = name or "v1"

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not _ops.distributed():
            return pairs
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        names = [f"{self._pp_prefix}.{i}.{v.name}" for i, v in enumerate(variables)]
        reduced = _ops.reduce_many(grads, names, [-i for i in range(len(grads))], self._pp_average,
                                   self._pp_compression)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name: str | None = None, use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "", compression=Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op=None, gradient_predivide_factor: float = 1.0):
    """Horovod's/BytePS's ``DistributedOptimizer`` for TensorFlow.

    * a Keras 3 optimizer (``tf.keras.optimizers.SGD(...)``): see :func:`pushpull.keras.DistributedOptimizer`;
    * a ``tf.compat.v1.train.Optimizer``: gradients are reduced in ``compute_gradients``.

    ``op``: Average (default) or Sum. For eager custom loops, Horovod's recommended
    ``DistributedGradientTape`` is the way.
    """
    average = _ops._average_of(None, op)
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        from pushpull.keras.optimizer import DistributedOptimizer as _keras_opt

        return _keras_opt(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                          gradient_predivide_factor=gradient_predivide_factor, op=op,
                          backward_passes_per_step=backward_passes_per_step)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1 or gradient_predivide_factor != 1.0:
            raise NotImplementedError("backward_passes_per_step and gradient_predivide_factor are not provided "
                                      "for TF1 optimizers")
        return _DistributedV1Optimizer(optimizer, name, compression, average)
    raise TypeError(f"DistributedOptimizer: {type(optimizer).__module__}.{type(optimizer).__name__} is neither a "
                    f"Keras 3 optimizer nor a tf.compat.v1.train.Optimizer (legacy tf.keras / tf_keras optimizers "
                    f"are not supported; use DistributedGradientTape in a custom loop)")


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 ``MonitoredTrainingSession`` hook: broadcasts all global variables from ``root_rank`` once the
    session exists (Horovod's/BytePS's hook of the same name)."""

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = _ops.broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
