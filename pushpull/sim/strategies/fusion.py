"""Horovod-style tensor fusion: every cycle, pack the gradients that became
ready into buffers of at most ``threshold_bytes`` and reduce each buffer.

Fewer, larger messages amortise the per-message latency at the price of
waiting up to one cycle. Cycles are counted from the start of the backward
pass (Horovod's background loop is free-running; anchoring it keeps every
iteration identical). A tensor larger than the threshold travels alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pushpull.sim.strategies.base import CommTask, ReadyTensor, Strategy, StrategyContext, group_name


@dataclass
class Fusion(Strategy):
    threshold_bytes: int = 64 * 1024 * 1024
    cycle_s: float = 1e-3
    name = "fusion"

    def __post_init__(self):
        if self.threshold_bytes < 1:
            raise ValueError(f"threshold_bytes must be >= 1, got {self.threshold_bytes!r}")
        if not (self.cycle_s >= 0) or math.isinf(self.cycle_s):
            raise ValueError(f"cycle_s must be a finite number >= 0, got {self.cycle_s!r}")

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        # group the ready stream by the cycle tick that first sees each tensor
        by_tick: dict[float, list[ReadyTensor]] = {}
        for t in ctx.ready:
            if t.nbytes <= 0:
                continue
            if self.cycle_s == 0:
                tick = t.ready_s
            else:
                tick = math.ceil(t.ready_s / self.cycle_s - 1e-9) * self.cycle_s
            by_tick.setdefault(tick, []).append(t)
        tasks: list[CommTask] = []
        for tick in sorted(by_tick):
            buf: list[ReadyTensor] = []
            size = 0
            for t in by_tick[tick] + [None]:
                if t is None or (buf and size + t.nbytes > self.threshold_bytes):
                    if buf:
                        tasks.append(CommTask(group_name("fusion", len(tasks), buf), tick,
                                              [(x.index, x.nbytes) for x in buf]))
                    buf, size = [], 0
                if t is not None:
                    buf.append(t)
                    size += t.nbytes
        return tasks

    def describe(self) -> str:
        t = self.threshold_bytes
        size = f"{t // 2**20}MiB" if t % 2**20 == 0 else f"{t / 1e6:g}MB"
        return f"fusion({size}, {self.cycle_s * 1e3:g}ms)"
