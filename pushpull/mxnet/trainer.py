"""Gluon ``DistributedTrainer`` (Horovod's and BytePS's name) and MXNet's ``DistributedOptimizer``.

``DistributedTrainer`` is a ``gluon.Trainer`` without a kvstore whose gradient
reduction averages every gradient over all workers through pushpull, priority
minus the parameter's index (Gluon lists parameters in definition order, the
forward order for sequential models); with ``step(b)`` on every worker, N
workers follow one process that calls ``step(N*b)`` on the concatenated batch.
"""
from __future__ import annotations

import mxnet as mx

from pushpull.mxnet import ops as _ops


class DistributedTrainer(mx.gluon.Trainer):
    """``gluon.Trainer`` whose ``allreduce_grads`` averages over all workers.

    ``root_rank``: the parameters are broadcast from it at construction (parameters still awaiting Gluon's
    deferred initialisation: at the first step), as BytePS's trainer does; ``None`` leaves that to the caller
    (``broadcast_parameters``), as Horovod's does. ``prefix`` names the tensors: two trainers over
    different parameters in one job need different prefixes.
    """

    def __init__(self, params, optimizer, optimizer_params=None, compression=None,
                 gradient_predivide_factor: float = 1.0, prefix: str | None = None, root_rank: int | None = 0,
                 compression_params=None):
        if compression_params is not None and compression is None:
            from pushpull.worker.compression import Compression

            compression = Compression.build(**compression_params) if "compressor" in compression_params \
                else None
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._pp_compression = compression
        self._pp_prefix = prefix or "gluon"
        self._pp_predivide = float(gradient_predivide_factor)
        self._pp_root = root_rank
        self._pp_broadcast_done = root_rank is None
        # now, so that the first gradients are computed from the root's weights; parameters whose shape is
        # still unknown (Gluon's deferred init) are broadcast at the first step instead, after that step's
        # backward pass: run one forward pass before building the trainer to avoid that
        if not self._pp_broadcast_done and _ops.distributed() and \
                not any(p._deferred_init for p in self._params):
            self._pp_broadcast()

    def _pp_broadcast(self) -> None:
        if self._pp_broadcast_done:
            return
        params = {f"{i}.{p.name}": p for i, p in enumerate(self._params)}
        _ops.broadcast_parameters(params, self._pp_root, prefix=f"{self._pp_prefix}.init.")
        self._pp_broadcast_done = True

    def _allreduce_grads(self):
        if not _ops.distributed():
            return
        items = []
        for i, p in enumerate(self._params):
            if p.grad_req == "null":
                continue
            grads = p.list_grad()
            src = grads[0] if len(grads) == 1 else mx.nd.add_n(*[g.as_in_context(grads[0].context)
                                                                  for g in grads])
            items.append((f"{self._pp_prefix}.{i}.{p.name}", -i, src, grads))
        pre = 1.0 / self._pp_predivide
        post = self._pp_predivide / _ops.size()
        # sum of the pre-divided gradients, then the rest of 1/size: the average (Horovod's predivide)
        _ops.reduce_many(items, average=False, compression=self._pp_compression, prescale=pre, postscale=post)

    def step(self, batch_size, ignore_stale_grad=False):
        if not self._pp_broadcast_done and _ops.distributed():
            if not self._kv_initialized:
                self._init_kvstore()
            self._pp_broadcast()
        super().step(batch_size, ignore_stale_grad)

    def update(self, batch_size, ignore_stale_grad=False):
        if not self._pp_broadcast_done and _ops.distributed():
            self._pp_broadcast()
        super().update(batch_size, ignore_stale_grad)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Horovod's MXNet ``DistributedOptimizer``: wraps an ``mx.optimizer.Optimizer`` so that ``update``
    first averages the gradient over all workers (for the Module API's local updates; Gluon users take
    ``DistributedTrainer``). Each update is its own reduction, so there is no overlap between keys."""

    def __init__(self, optimizer, prefix: str = "mxopt"):
        self._optimizer = optimizer
        self._pp_prefix = prefix

    def __getattr__(self, item):
        return getattr(self.__dict__["_optimizer"], item)

    def __setattr__(self, key, value):
        # Trainer sets rescale_grad (and lr schedules set lr) on the optimizer it holds: the wrapped one
        if key in ("_optimizer", "_pp_prefix"):
            object.__setattr__(self, key, value)
        else:
            setattr(self._optimizer, key, value)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _reduce(self, index, grad) -> None:
        if not _ops.distributed():
            return
        if isinstance(index, (tuple, list)):
            for i, g in zip(index, grad):
                _ops.allreduce_(g, average=True, name=f"{self._pp_prefix}.{i}", priority=-int(i))
        else:
            _ops.allreduce_(grad, average=True, name=f"{self._pp_prefix}.{index}", priority=-int(index))

    def update(self, index, weight, grad, state):
        self._reduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._reduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)
