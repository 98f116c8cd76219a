"""MG-WFBP: merge gradients of neighbouring layers when that finishes the
communication sooner than sending them one by one (Shi et al., 2019).

With a linear cost ``t(bytes) = alpha + beta*bytes`` and the backward-time
profile, merging layer l-1 into the message that holds layer l saves one
``alpha`` and costs the time the message waits for l-1's gradient; walking
from the output to the input and merging whenever the wait is shorter than
``alpha`` (or there is no wait because the network is still busy) is the
greedy rule of the paper. Tiny layers are always merged: their message
would be all ``alpha``. The rule is :func:`pushpull.policy.mgwfbp.mgwfbp_merge`, shared with the
runtime; here it merges the profile's layers with the cluster's alpha-beta model.
"""
from __future__ import annotations

from dataclasses import dataclass

from pushpull.policy import register_executor
from pushpull.policy.mgwfbp import SMALL_ELEMENTS, mgwfbp_merge
from pushpull.sim.executors.base import CommTask, Strategy, StrategyContext, group_name

__all__ = ["MGWFBP", "SMALL_ELEMENTS", "mgwfbp_merge"]


@register_executor("mgwfbp", "simulator")
@dataclass
class MGWFBP(Strategy):
    """``plan``: buffer sizes in gradients, in ready order (output side first), to
    replay a plan a real run settled on instead of deciding one; see :meth:`tasks`."""
    small_elements: int = SMALL_ELEMENTS
    plan: list[int] | None = None
    name = "mgwfbp"

    def groups(self, ctx: StrategyContext) -> list[list[int]]:
        alpha, beta = ctx.cluster.alpha_beta()
        bwd = [l.bwd_s for l in ctx.profile.layers]
        sizes = [float(l.nbytes) for l in ctx.profile.layers]
        if self.compression is not None:
            c = self.compression
            sizes = [sum(t.nbytes / c.ratio if c.applies(t.nbytes) else t.nbytes for t in l.tensors)
                     for l in ctx.profile.layers]
        return mgwfbp_merge(bwd, sizes, alpha, beta, small_bytes=self.small_elements * 4)

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        if self.plan is not None:
            return self._planned_tasks(ctx)
        by_layer: dict[int, list] = {}
        for t in ctx.ready:
            if t.nbytes > 0:
                by_layer.setdefault(t.layer, []).append(t)
        names = [l.name for l in ctx.profile.layers]
        tasks = []
        for group in self.groups(ctx):
            members = [t for l in group for t in by_layer.get(l, [])]
            if not members:
                continue
            release = max(ctx.layer_ready_s[l] for l in group)
            name = f"mg{len(tasks)}[{names[group[0]]}]" if len(group) == 1 else \
                f"mg{len(tasks)}[{names[group[0]]}..{names[group[-1]]}]"
            tasks.append(CommTask(name, release, [(t.index, t.nbytes) for t in members]))
        return tasks

    def _planned_tasks(self, ctx: StrategyContext) -> list[CommTask]:
        """The live strategy's buffers: consecutive gradients in ready order, each buffer
        launched when its last gradient is ready."""
        ready = [t for t in ctx.ready if t.nbytes > 0]
        if sum(self.plan) != len(ready) or min(self.plan, default=1) < 1:
            raise ValueError(f"mgwfbp plan {self.plan}: buffer sizes must be >= 1 and add up to the "
                             f"{len(ready)} gradients")
        tasks, i = [], 0
        for size in self.plan:
            members = ready[i:i + size]
            i += size
            tasks.append(CommTask(group_name("mg", len(tasks), members), max(t.ready_s for t in members),
                                  [(t.index, t.nbytes) for t in members]))
        return tasks
