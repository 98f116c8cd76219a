"""Keras 3 ``DistributedOptimizer``: gradients averaged over all workers before the update.

Keras 3 optimizers funnel every update (``model.fit``'s ``apply_gradients``,
a custom loop's ``apply``) through ``Optimizer.apply(grads, variables)``, so the
wrapper is a subclass of the user's optimizer class that reduces the gradients
there and then lets the original ``apply`` do everything else (loss-scale
unscaling, clipping, weight decay, Keras's own gradient accumulation).

Backends: TensorFlow (the reduction runs through :mod:`pushpull.tensorflow`,
inside ``model.fit``'s ``tf.function``, each push starting when its gradient
is ready) and torch (Keras runs eagerly there and its gradients are torch
tensors, so they go straight to the engine, no conversion).
JAX is not supported: its ``stateless_apply`` runs under ``jax.jit``.
"""
from __future__ import annotations

import keras

from pushpull.worker.compression import Compression
from pushpull.worker.context import CONTEXT as _ctx
from pushpull.worker.context import distributed as _distributed


def _backend() -> str:
    return keras.backend.backend()


def _reduce_torch(grads, names, priorities, average: bool, compression):
    """torch backend: Keras's gradients are torch tensors; all started, last layer first, then waited."""
    import torch

    out = list(grads)
    live = sorted((i for i, g in enumerate(grads) if g is not None), key=lambda i: (priorities[i], -i))
    handles = {}
    for i in live:
        g = grads[i]
        if not isinstance(g, torch.Tensor):
            g = torch.as_tensor(keras.ops.convert_to_numpy(g))
        handles[i] = _ctx.push_pull_async(g.detach(), None, average, names[i], priorities[i], compression)
    err = None
    for i in live:
        try:
            out[i] = _ctx.synchronize(handles[i])
        except Exception as e:  # noqa: BLE001 - wait for the rest so no handle is left behind
            err = err or e
    if err is not None:
        raise err
    return out


def reduce_gradients(grads, variables, average: bool = True, compression=None, prefix: str = "keras"):
    """Average (or sum) ``grads`` over all workers; names from the variables' paths, priorities minus
    their position (Keras lists trainable variables in layer order, i.e. forward order)."""
    grads = list(grads)
    variables = list(variables)
    # index, path and shape: equal on every worker that built the same model, distinct between models
    names = [f"{prefix}.{i}.{getattr(v, 'path', None) or v.name}.{'x'.join(map(str, v.shape))}"
             for i, v in enumerate(variables)]
    priorities = [-i for i in range(len(grads))]
    backend = _backend()
    if backend == "tensorflow":
        from pushpull.tensorflow import ops as tfops

        return tfops.reduce_many(grads, names, priorities, average, compression)
    if backend == "torch":
        return _reduce_torch(grads, names, priorities, average, compression)
    raise NotImplementedError(f"pushpull.keras supports the tensorflow and torch Keras backends, not {backend!r}")


class _Distributed:
    """Mixed into a dynamic subclass of the user's optimizer class (so isinstance, get_config and
    the class name stay the user's)."""

    _pp_compression = None
    _pp_average = True
    _pp_prefix = "keras"

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if grads and _distributed():
            variables = list(trainable_variables) if trainable_variables is not None else \
                list(getattr(self, "_trainable_variables", []))
            if len(variables) != len(grads):
                raise ValueError(f"DistributedOptimizer.apply: {len(grads)} gradients for {len(variables)} "
                                 f"variables")
            grads = reduce_gradients(grads, variables, self._pp_average, self._pp_compression, self._pp_prefix)
        return super().apply(grads, trainable_variables)


def DistributedOptimizer(optimizer, name: str | None = None, device_dense: str = "", device_sparse: str = "",
                         compression=Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op=None, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0):
    """Horovod's Keras ``DistributedOptimizer`` for a Keras 3 optimizer.

    Returns a new optimizer of the same class and configuration (Horovod's behaviour: built from
    ``optimizer.get_config()``; an optimizer that already has state keeps it, its class is swapped
    in place). ``op``: Average (default) or Sum. Sparse gradients travel dense.

    ``backward_passes_per_step`` > 1 is refused: use Keras 3's own
    ``gradient_accumulation_steps=k`` on the optimizer; the reduction then happens every step (before
    Keras accumulates), which gives the same update but does not save traffic.
    """
    if backward_passes_per_step != 1:
        raise NotImplementedError(
            "backward_passes_per_step > 1 is not provided for Keras 3: pass gradient_accumulation_steps=k to "
            "the Keras optimizer instead (the gradients are then reduced every step, before Keras accumulates "
            "them, which gives the same update)")
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError("gradient_predivide_factor is not provided for Keras (average or sum only)")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"pushpull.keras.DistributedOptimizer wraps a keras.optimizers.Optimizer (Keras 3), got "
                        f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    if isinstance(optimizer, _Distributed):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    base = type(optimizer)
    cls = type(base.__name__, (_Distributed, base), {"__module__": base.__module__,
                                                      "__doc__": base.__doc__})
    if optimizer.built and optimizer.variables:
        new = optimizer
        new.__class__ = cls
    else:
        new = cls.from_config(optimizer.get_config())
    new._pp_compression = compression
    new._pp_average = _average_of_op(op)
    new._pp_prefix = name or "keras"
    return new


def _average_of_op(op) -> bool:
    """Horovod's op constants are 0 (Average) and 1 (Sum) here, as in pushpull.tensorflow."""
    if op is None:
        return True
    value = int(op)
    if value == 0:
        return True
    if value == 1:
        return False
    raise NotImplementedError("op: the Keras DistributedOptimizer reduces gradients with op=Average or op=Sum")
