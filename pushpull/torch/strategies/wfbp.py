"""WFBP (wait-free backpropagation): each gradient is reduced on its own as soon
as it is ready, overlapping communication with the rest of the backward pass.
Over the parameter servers the worker's credit queue still orders partitions by
priority, so this is also ByteScheduler's path when a credit is set."""
from __future__ import annotations

import torch

from pushpull.torch.strategies.base import Strategy
from pushpull.torch import ops


class WFBP(Strategy):
    name = "wfbp"

    def __init__(self, compression=None, **options):
        super().__init__(compression, **options)
        self._handles: list[tuple[str, int]] = []

    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        h = ops.push_pull_async_inplace(grad, average=True, name=name, priority=priority,
                                        compression=self.compression)
        self._handles.append((name, h))

    def wait_all(self) -> None:
        handles, self._handles = self._handles, []
        for _, h in handles:
            ops.synchronize(h)

    def pending(self) -> int:
        return len(self._handles)
