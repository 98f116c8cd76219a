"""Horovod's Keras callbacks for Keras 3 (``hvd.callbacks.X`` / ``pushpull.keras.callbacks.X``).

They talk to the engine through the framework-neutral job context with small
float64 or bit-view NumPy arrays, so they work on Keras's tensorflow and torch
backends alike.
"""
from __future__ import annotations

import logging
import zlib

import keras
import numpy as np

from pushpull.worker import broadcast as _bc
from pushpull.worker.context import CONTEXT as _ctx
from pushpull.worker.context import distributed as _distributed

log = logging.getLogger("pushpull.keras")


def broadcast_variables(variables, root_rank: int, prefix: str) -> None:
    """Assign ``root_rank``'s values to Keras variables on every rank (bit-exact, any dtype). Every
    rank first checks that all pass the same set (count, dtypes, shapes), or all raise naming who differs."""
    variables = list(variables)
    _bc.check_root(root_rank)
    if not _distributed() or not variables:
        return
    pairs = [(f"{i}.{getattr(v, 'path', None) or v.name}", np.array(keras.ops.convert_to_numpy(v.value), order="C"))
             for i, v in enumerate(variables)]
    for v, arr in zip(variables, _bc.broadcast_checked(pairs, root_rank, prefix)):
        v.assign(arr)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every worker start from ``root_rank``'s model weights and optimizer state.

    Keras 3 builds the model and the optimizer before ``on_train_begin``, so the broadcast happens
    there, before the first step (Horovod had to wait for the end of the first batch, when tf.keras
    created optimizer slots). If the optimizer is not built yet then, its variables follow after the
    first batch.
    """

    def __init__(self, root_rank: int = 0, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._optimizer_pending = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        variables = list(self.model.variables)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and opt.built:
            variables += list(opt.variables)
        else:
            self._optimizer_pending = opt is not None
        broadcast_variables(variables, self.root_rank, "keras.bcast.")
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None):
        if self._optimizer_pending:
            self._optimizer_pending = False
            broadcast_variables(self.model.optimizer.variables, self.root_rank, "keras.bcast.opt.")


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (the numbers in ``logs``) over all workers at the end of each epoch,
    so that callbacks after it (checkpointing, ReduceLROnPlateau, early stopping) see the same values
    on every worker. Put it before them in the callback list."""

    def __init__(self, device: str = ""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not _distributed():
            return
        keys = sorted(k for k, v in logs.items() if _scalar(v))
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        # the name carries the key set: workers whose metrics differ fail (timeout naming it) instead of
        # averaging different metrics with each other
        crc = zlib.crc32(";".join(keys).encode())
        avg = _ctx.push_pull(values, None, True, f"keras.metric_average.{crc:08x}.{len(keys)}")
        for k, v in zip(keys, avg.tolist()):
            logs[k] = v


def _scalar(v) -> bool:
    try:
        return np.ndim(v) == 0 and isinstance(float(v), float)
    except (TypeError, ValueError):
        return False


def _set_lr(opt, value: float) -> None:
    opt.learning_rate = value


def _get_lr(opt) -> float:
    return float(keras.ops.convert_to_numpy(opt.learning_rate))


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Goyal et al.'s gradual warm-up, per batch: the learning rate rises linearly from
    ``initial_lr / size()`` to ``initial_lr`` over ``warmup_epochs`` (Horovod's formula
    ``lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)`` with a fractional epoch).

    ``momentum_correction`` (Horovod's default): when the rate changes from a to b, SGD's velocity,
    which in Keras 3 already contains the learning rate (``v = m*v - lr*g``), is scaled by b/a, the
    correction the paper prescribes. Keras 3 compiles ``momentum`` into the training function as a
    constant, so Horovod's way (changing momentum for one batch) cannot work; scaling the velocity
    variables can. Optimizers without velocity variables (Adam, ...) need no correction.
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def _lr_at(self, epoch: float) -> float:
        n = _ctx.need_init().size
        if self.warmup_epochs <= 0 or epoch >= self.warmup_epochs:
            return self.initial_lr
        return self.initial_lr / n * (epoch * (n - 1) / self.warmup_epochs + 1)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.steps_per_epoch:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch (not known from fit's params)")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self.current_epoch + batch / self.steps_per_epoch
        if epoch > self.warmup_epochs + 1.0 / self.steps_per_epoch:
            return  # after the warm-up the rate is the user's (another callback may schedule it)
        opt = self.model.optimizer
        old, new = _get_lr(opt), self._lr_at(epoch)
        if old == new:
            return
        _set_lr(opt, new)
        if self.momentum_correction and old > 0:
            for m in getattr(opt, "momentums", None) or ():
                m.assign(m * (new / old))
        if self.verbose and batch == 0:
            log.warning("epoch %d: learning rate %g (warm-up)", self.current_epoch, new)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class DiLoCoCallback(keras.callbacks.Callback):
    """DiLoCo under ``model.fit`` (:class:`pushpull.keras.diloco.DiLoCo`): the model's optimizer is the inner one
    (not wrapped in DistributedOptimizer), an outer round follows every ``sync_every`` batches, and one more at
    the end of training, so every worker ends with the global parameters. The keyword arguments are DiLoCo's;
    ``self.diloco`` is the running one (its ``rounds`` and ``steps``)."""

    def __init__(self, sync_every: int = 100, **kwargs):
        super().__init__()
        self.sync_every, self.kwargs = sync_every, kwargs
        self.diloco = None

    def on_train_begin(self, logs=None):
        if keras.backend.backend() not in ("tensorflow", "torch"):
            raise NotImplementedError(f"DiLoCoCallback supports the tensorflow and torch Keras backends, not "
                                      f"{keras.backend.backend()!r} (its fit keeps the weights outside the variables)")
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if spe > 1:  # the callback would see every spe-th batch: the rounds could not fall on their steps
            raise ValueError(f"DiLoCoCallback needs steps_per_execution=1 (the model has {spe}): the outer rounds "
                             f"fall between batches")
        variables = list(self.model.trainable_variables)
        if self.diloco is None:
            from pushpull.keras.diloco import DiLoCo

            self.diloco = DiLoCo(variables, sync_every=self.sync_every, **self.kwargs)
        elif [id(v) for v in variables] != [id(v) for v in self.diloco.vars]:  # a second fit() goes on
            raise ValueError("DiLoCoCallback: the model's trainable variables changed since the first fit() (a "
                             "layer frozen or unfrozen, or another model): use a new callback")

    def on_train_batch_end(self, batch, logs=None):
        self.diloco.step()

    def on_train_end(self, logs=None):
        self.diloco.sync()
