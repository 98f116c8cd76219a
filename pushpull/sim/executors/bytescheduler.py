"""ByteScheduler: partition tensors, send the partitions by priority under a
credit.

Priority is the forward-order layer index (the input layer is needed first
by the next forward pass), ties by partition index; credit bounds the bytes
admitted to the network but not yet reduced. A small credit keeps the
network queue short, so a partition of an early layer that becomes ready
late overtakes everything still waiting; nothing admitted is pre-empted.
Defaults follow ByteScheduler: 1M / 4M float32 elements (partition /
credit) for PS, 8M / 16M for all-reduce (:mod:`pushpull.policy.bytescheduler`, shared with the
runtime and the benchmark grid).

Over PS, as in pushpull's worker engine and BytePS, a partition *is* a key:
it goes whole to one server (one push, one pull), and its credit comes back
with the push acknowledgement, not when its pull completes. A partition
larger than the credit is sent alone (stop-and-wait: nothing else starts
until its acknowledgement).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pushpull.policy import bytescheduler as policy
from pushpull.policy import register_executor
from pushpull.sim.config import ClusterConfig
from pushpull.sim.executors.base import CommTask, Discipline, Strategy, StrategyContext


@register_executor("bytescheduler", "simulator")
@dataclass
class ByteScheduler(Strategy):
    partition_bytes: int | None = None   # None -> backend default
    credit_bytes: float | None = None    # None -> backend default; math.inf -> no credit
    name = "bytescheduler"

    def __post_init__(self):
        if self.partition_bytes is not None and self.partition_bytes < 1:
            raise ValueError(f"partition_bytes must be >= 1, got {self.partition_bytes!r}")
        if self.credit_bytes is not None and not (self.credit_bytes > 0):
            raise ValueError(f"credit_bytes must be > 0, got {self.credit_bytes!r}")

    def resolved(self, cluster: ClusterConfig) -> tuple[int, float]:
        return policy.ByteScheduler.scheduling(cluster.backend, partition_bytes=self.partition_bytes,
                                               credit=self.credit_bytes)

    def discipline(self, cluster: ClusterConfig) -> Discipline:
        _, credit = self.resolved(cluster)
        return Discipline(by_priority=True, credit_bytes=None if math.isinf(credit) else credit,
                          credit_release="push" if cluster.backend == "ps" else "done")

    def ps_key_bytes(self, cluster: ClusterConfig) -> int:
        return self.resolved(cluster)[0]

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        part, _ = self.resolved(ctx.cluster)
        tasks = []
        for t in ctx.ready:
            if t.nbytes <= 0:
                continue
            sizes = policy.partitions(t.nbytes, part)
            for j, size in enumerate(sizes):
                name = t.name if len(sizes) == 1 else f"{t.name}.p{j}"
                tasks.append(CommTask(name, t.ready_s, [(t.index, size)], priority=(t.layer, j, t.pos)))
        return tasks

    def describe(self) -> str:
        p, c = self.partition_bytes, self.credit_bytes
        fmt = lambda v: "default" if v is None else ("inf" if math.isinf(v) else f"{v / 1e6:g}MB")
        return f"bytescheduler(partition={fmt(p)}, credit={fmt(c)})"
