"""Horovod's ``SyncBatchNorm``: batch normalization whose statistics cover every worker's batch.

In training mode the mean and the variance are reduced over all workers with two differentiable
``allreduce(op=Sum)`` calls (the sum and count first, then the squared deviations: two passes, no
cancellation). Because the allreduce's gradient is the allreduce of the upstream gradients, autograd gives
each worker exactly its rows of the gradient of the global batch's loss; nothing else is hand-written.
In eval mode, or with one worker, it is ``torch.nn.BatchNorm`` with the running statistics.
"""
from __future__ import annotations

import itertools

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from pushpull.torch import collectives, ops

_instances = itertools.count()  # construction order names the keys: the same on every rank


class SyncBatchNorm(_BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm1d/2d/3d`` (and Horovod's ``hvd.SyncBatchNorm``); every rank must
    build its modules in the same order and call them the same number of times."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self._key = f"SyncBatchNorm.{next(_instances)}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2D input (batch, channels, ...), got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        distributed = ops.size() > 1 or ops.config().force_distributed
        if not (self.training and distributed):
            return super().forward(input)
        c = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = [1, c] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() // c], dtype=input.dtype, device=input.device)
        first = collectives.allreduce(torch.cat([input.sum(dims), count]), op=collectives.Sum,
                                      name=f"{self._key}.sum")
        n = first[c]
        if n.item() < 2:
            raise ValueError(f"SyncBatchNorm needs more than one value per channel over all workers, got {int(n)}")
        mean = first[:c] / n
        centered = input - mean.view(shape)
        var = collectives.allreduce((centered * centered).sum(dims), op=collectives.Sum,
                                    name=f"{self._key}.var") / n
        if self.track_running_stats:
            with torch.no_grad():
                factor = 0.0 if self.momentum is None else self.momentum
                if self.num_batches_tracked is not None:
                    self.num_batches_tracked.add_(1)
                    if self.momentum is None:
                        factor = 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * (n / (n - 1)) * factor)
        out = centered * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
