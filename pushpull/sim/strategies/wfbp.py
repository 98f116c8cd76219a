"""WFBP (wait-free backpropagation): one reduction per tensor as soon as its
gradient is ready, first come first served.

The natural overlap of backward and communication without any reordering;
the reference every other strategy's speedup is quoted against.
"""
from __future__ import annotations

from dataclasses import dataclass

from pushpull.sim.strategies.base import CommTask, Strategy, StrategyContext


@dataclass
class WFBP(Strategy):
    name = "wfbp"

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        return [CommTask(t.name, t.ready_s, [(t.index, t.nbytes)])
                for t in ctx.ready if t.nbytes > 0]
