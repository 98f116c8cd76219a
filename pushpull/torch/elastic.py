"""Elastic training: a job that goes on when a worker dies, in the shape of Horovod Elastic's API
(``State.commit``/``restore``/``sync`` and a ``run`` decorator).

Why a commit/restore API rather than transparent recovery: when a worker dies mid-step, the survivors
may each have applied a different number of updates of that step (some had their averaged gradients,
some not). Rolling every survivor back to the last state they all committed, then copying rank 0's,
makes them identical again at a known point; the training function then resumes from there.

How (PUSHPULL_MIN_WORKERS or ``pushpull launch --min-workers M``): the scheduler notices the dead
worker from its closed connection (or heartbeats), renumbers the survivors 0..n'-1, tells the servers
(which drop every round in flight and expect n' pushes) and then the workers, whose operations in
flight raise :class:`WorkersChanged`. :func:`run` catches it, restores the last commit, resets the
optimizers, calls the reset callbacks (re-shard data from ``size()``/``rank()`` there, or read them
again at the top of the epoch) and syncs from the new rank 0.

    state = elastic.TorchState(model, optimizer, epoch=0)

    @elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...  # one epoch, sharded by bps.rank() / bps.size() read here
            state.commit()

    train(state)
"""
from __future__ import annotations

import copy
import functools
import logging
from typing import Callable

import torch

from pushpull.torch import functions, ops
from pushpull.worker.handle import WorkersChanged

log = logging.getLogger("pushpull.elastic")

__all__ = ["State", "TorchState", "WorkersChanged", "run"]


class State:
    """Named values (``state.epoch``, ``state.batch``, ...) that survive a change of workers: ``commit()``
    keeps a copy, ``restore()`` goes back to it, ``sync()`` makes every worker's equal to rank 0's."""

    def __init__(self, **values):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_saved", copy.deepcopy(values))
        object.__setattr__(self, "_callbacks", [])
        object.__setattr__(self, "resets", 0)

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        if name in self.__dict__ or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._values[name] = value

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Called after each change of workers, once the state is restored and before it is synced."""
        self._callbacks.extend(callbacks)

    def commit(self) -> None:
        self.__dict__["_saved"] = copy.deepcopy(self._values)

    def restore(self) -> None:
        self._values.clear()
        self._values.update(copy.deepcopy(self._saved))

    def sync(self) -> None:
        """Every worker takes rank 0's values (JSON-able values travel as JSON, tensors as tensors)."""
        if ops.engine() is not None:
            self._values.update(functions.broadcast_object(dict(self._values), root_rank=0, name="elastic.state"))

    def on_reset(self) -> None:
        for fn in self._callbacks:
            fn()


class TorchState(State):
    """A model's parameters and buffers and an optimizer's state, besides named values. The optimizer's
    step in progress is dropped on a reset (``DistributedOptimizer.reset``)."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **values):
        super().__init__(**values)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "_model_saved", None)
        object.__setattr__(self, "_opt_saved", None)
        self._save_torch()

    def _save_torch(self) -> None:
        if self.model is not None:
            self.__dict__["_model_saved"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.optimizer is not None:
            self.__dict__["_opt_saved"] = copy.deepcopy(self.optimizer.state_dict())

    def commit(self) -> None:
        super().commit()
        self._save_torch()

    def restore(self) -> None:
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None:
            if hasattr(self.optimizer, "reset"):
                self.optimizer.reset()
            if self._opt_saved is not None:
                self.optimizer.load_state_dict(copy.deepcopy(self._opt_saved))

    def sync(self) -> None:
        super().sync()
        if ops.engine() is None:
            return
        if self.model is not None:
            functions.broadcast_parameters(self.model.state_dict(), root_rank=0, prefix="elastic.model.")
        if self.optimizer is not None:
            functions.broadcast_optimizer_state(self.optimizer, root_rank=0, prefix="elastic.opt.")


def run(fn: Callable) -> Callable:
    """Call ``fn(state, ...)``; each time the workers change under it (:class:`WorkersChanged`), restore
    ``state``'s last commit, run its reset callbacks, sync it from the new rank 0 and call ``fn`` again.
    The state is synced once before the first call, so every worker starts from rank 0's."""

    @functools.wraps(fn)
    def wrapper(state: State, *args, **kwargs):
        synced = False
        while True:
            try:
                if not synced:  # every worker from rank 0's state, committed: the same point to come back to
                    state.sync()
                    state.commit()
                    synced = True
                return fn(state, *args, **kwargs)
            except WorkersChanged as e:
                object.__setattr__(state, "resets", state.resets + 1)
                log.warning("workers changed (%s); restoring the last commit and going on as rank %d of %d",
                            e, ops.rank(), ops.size())
                state.restore()
                state.on_reset()
                synced = False
    return wrapper
