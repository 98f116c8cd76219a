"""BSP: one fused reduction after the whole backward pass.

The baseline with no overlap at all: communication starts when the last
gradient is ready, so iteration = compute + communication.
"""
from __future__ import annotations

from dataclasses import dataclass

from pushpull.sim.strategies.base import CommTask, Strategy, StrategyContext


@dataclass
class BSP(Strategy):
    name = "bsp"

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        parts = [(t.index, t.nbytes) for t in ctx.ready if t.nbytes > 0]
        if not parts:
            return []
        return [CommTask("bsp[all]", ctx.backward_s, parts)]
