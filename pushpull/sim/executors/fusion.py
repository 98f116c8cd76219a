"""Horovod-style tensor fusion: every cycle, pack the gradients that became
ready into buffers of at most ``threshold_bytes`` and reduce each buffer.

Fewer, larger messages amortise the per-message latency at the price of
waiting up to one cycle. Cycles are counted from the start of the backward
pass (Horovod's background loop is free-running; anchoring it keeps every
iteration identical). A tensor larger than the threshold travels alone. The packing is the
policy's (:func:`pushpull.policy.fusion.fusion_plan`), the one the runtime runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pushpull.policy import register_executor
from pushpull.policy.fusion import CYCLE_MS, THRESHOLD_BYTES, cycle_tick, fusion_plan
from pushpull.sim.executors.base import CommTask, Strategy, StrategyContext, group_name


@register_executor("fusion", "simulator")
@dataclass
class Fusion(Strategy):
    threshold_bytes: int = THRESHOLD_BYTES
    cycle_s: float = CYCLE_MS / 1e3
    name = "fusion"

    def __post_init__(self):
        if self.threshold_bytes < 1:
            raise ValueError(f"threshold_bytes must be >= 1, got {self.threshold_bytes!r}")
        if not (self.cycle_s >= 0) or math.isinf(self.cycle_s):
            raise ValueError(f"cycle_s must be a finite number >= 0, got {self.cycle_s!r}")

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        ready = [t for t in ctx.ready if t.nbytes > 0]
        groups = fusion_plan([t.ready_s for t in ready], [t.nbytes for t in ready], self.threshold_bytes,
                             self.cycle_s)
        tasks: list[CommTask] = []
        for g in groups:
            buf = [ready[i] for i in g]
            tasks.append(CommTask(group_name("fusion", len(tasks), buf), cycle_tick(buf[0].ready_s, self.cycle_s),
                                  [(x.index, x.nbytes) for x in buf]))
        return tasks

    def describe(self) -> str:
        t = self.threshold_bytes
        size = f"{t // 2**20}MiB" if t % 2**20 == 0 else f"{t / 1e6:g}MB"
        return f"fusion({size}, {self.cycle_s * 1e3:g}ms)"
