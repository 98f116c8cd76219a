"""ByteScheduler: partition + priority + credit. Each gradient is submitted as
soon as it is ready (as WFBP), but the backend cuts it into partitions,
queues them by priority (the layer nearest the input first) and admits them
while the bytes in flight are under the credit, so a partition of an early
layer that becomes ready late overtakes everything still queued.

Over the parameter servers the worker engine's credit queue does this; over
all-reduce the reducer's rank 0 does it and the other ranks follow its order
(:mod:`pushpull.torch.allreduce_backend`). Options ``partition_bytes`` and ``credit``
(bytes in flight) override PUSHPULL_BYTESCHEDULER_*; the defaults are the policy's
(:mod:`pushpull.policy.bytescheduler`, ByteScheduler's: 1 M / 4 M float32 elements over PS, 8 M / 16 M
over all-reduce), shared with the simulator and the benchmark grid.
"""
from __future__ import annotations

import torch

from pushpull.policy import bytescheduler as policy
from pushpull.policy import register_executor
from pushpull.torch import ops
from pushpull.torch.executors.base import Strategy


@register_executor("bytescheduler", "runtime")
class ByteScheduler(Strategy):
    name = "bytescheduler"

    def __init__(self, compression=None, partition_bytes: int | None = None, credit: int | None = None,
                 **options):
        self._want = (partition_bytes, credit)
        super().__init__(compression, **options)

    def scheduling(self) -> tuple[int, int]:
        part, credit = self._want
        cfg = ops.config()
        part, credit = policy.ByteScheduler.scheduling(
            self.comm.backend, partition_bytes=part or cfg.bytescheduler_partition_bytes or None,
            credit=credit or cfg.bytescheduler_credit_bytes or None)
        part, credit = int(part), int(credit)
        if part < 1024 or credit < 1:
            raise ValueError(f"bytescheduler: partition_bytes must be >= 1024 and credit >= 1 byte, got "
                             f"partition_bytes={part}, credit={credit}")
        self.partition_bytes, self.credit_bytes = part, credit
        return part, credit

    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        self._launch(name, [(name, grad)], priority)
