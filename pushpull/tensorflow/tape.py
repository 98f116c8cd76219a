"""``DistributedGradientTape``: Horovod's wrapper of ``tf.GradientTape``.

``gradient()`` computes the local gradients and returns their average over all
workers. Each gradient gets priority minus its source's index (sources are
normally listed in forward order, as ``model.trainable_variables`` is), so the
input layer is the most urgent, as in pushpull.torch. Inside a ``tf.function``
each gradient's push starts as soon as TensorFlow has computed it; eagerly,
``tf.GradientTape.gradient`` returns all gradients at once (TensorFlow offers
no per-gradient hook there), so the pushes start together, last layer first.
"""
from __future__ import annotations

import tensorflow as tf

from pushpull.tensorflow import ops as _ops
from pushpull.worker.compression import Compression


def _flatten(sources):
    return tf.nest.flatten(sources)


class _DistributedGradientTape(tf.GradientTape):
    """A tf.GradientTape sharing the wrapped tape's recorded state; only ``gradient`` differs."""

    def __init__(self, tape: tf.GradientTape, compression, sparse_as_dense: bool, average: bool, name: str,
                 prescale: float, postscale: float):
        # take over the recording the user made with the original tape (Horovod's usage wraps it after
        # the `with` block); nothing is copied, both objects see the same tape
        self.__dict__.update(tape.__dict__)
        self._pp_compression = compression
        self._pp_average = average
        self._pp_name = name
        self._pp_scale = (prescale, postscale)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        if not _ops.distributed():
            return grads
        flat_sources = _flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        names = [f"{self._pp_name}.{_ops._var_name(s, i)}.{'x'.join(map(str, s.shape))}"
                 for i, s in enumerate(flat_sources)]
        reduced = _ops.reduce_many(flat_grads, names, [-i for i in range(len(flat_grads))], self._pp_average,
                                   self._pp_compression, *self._pp_scale)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression=Compression.none, sparse_as_dense: bool = False, op=None,
                            gradient_predivide_factor: float = 1.0, name: str = "tape"):
    """Wrap ``gradtape`` so ``gradient()`` returns gradients averaged (``op=Average``) or summed
    (``op=Sum``) over all workers. Sparse gradients (IndexedSlices) always travel dense.

    ``gradient_predivide_factor`` f: gradients are divided by f before the sum and by size/f after
    (Horovod's meaning); 1.0 is a plain average. ``name`` prefixes the tensor names: two tapes over
    different models used concurrently need different names.
    """
    average = _ops._average_of(None, op)
    pre, post = 1.0, 1.0
    if gradient_predivide_factor != 1.0:
        if not average:
            raise ValueError("gradient_predivide_factor needs op=Average (Horovod's rule)")
        pre, post, average = 1.0 / gradient_predivide_factor, gradient_predivide_factor / _ops.size(), False
    return _DistributedGradientTape(gradtape, compression, sparse_as_dense, average, name, pre, post)
