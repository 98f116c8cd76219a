"""MG-WFBP: merge gradients of neighbouring layers when that finishes the
communication sooner than sending them one by one (Shi et al., 2019).

With a linear cost ``t(bytes) = alpha + beta*bytes`` and the backward-time
profile, merging layer l-1 into the message that holds layer l saves one
``alpha`` and costs the time the message waits for l-1's gradient; walking
from the output to the input and merging whenever the wait is shorter than
``alpha`` (or there is no wait because the network is still busy) is the
greedy rule of the paper. Tiny layers are always merged: their message
would be all ``alpha``.
"""
from __future__ import annotations

from dataclasses import dataclass

from pushpull.sim.strategies.base import CommTask, Strategy, StrategyContext, group_name

SMALL_ELEMENTS = 8192


def mgwfbp_merge(bwd_times: list[float], sizes_bytes: list[float], alpha: float, beta: float,
                 small_bytes: float = SMALL_ELEMENTS * 4) -> list[list[int]]:
    """Group layers for MG-WFBP.

    ``bwd_times`` and ``sizes_bytes`` are per layer in *forward* order (index 0
    is the input layer). Returns the groups in communication order (the
    output-side group first), each group listing its layers output-first,
    e.g. ``[[3, 2], [1], [0]]``.

    Walk l = L-1 .. 1 with a current group G ending at layer l:
      * G would start at ``start = max(ready(l), end of the previous group)``
        and finish at ``start + alpha + beta*bytes(G)``;
      * merge l-1 into G when l-1 is ready before G would finish and
        either G would wait for the network anyway (ready(l-1) <= start) or
        the extra wait ``ready(l-1) - start`` is smaller than ``alpha``;
      * always merge when l-1 or G is smaller than ``small_bytes``.
    """
    L = len(bwd_times)
    if L != len(sizes_bytes):
        raise ValueError(f"sizes_bytes: expected {L} entries (one per layer), got {len(sizes_bytes)}")
    if L == 0:
        return []
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha!r}, beta={beta!r}")
    # ready[l]: when layer l's gradient is ready, counted from the start of the backward
    ready = [0.0] * L
    acc = 0.0
    for l in range(L - 1, -1, -1):
        acc += bwd_times[l]
        ready[l] = acc

    groups: list[list[int]] = []
    cur, cur_bytes, prev_end = [L - 1], float(sizes_bytes[L - 1]), 0.0
    for l in range(L - 1, 0, -1):
        c = l - 1
        start = max(ready[cur[-1]], prev_end)
        finish = start + alpha + beta * cur_bytes
        wait = ready[c] - start
        small = sizes_bytes[c] < small_bytes or cur_bytes < small_bytes
        ready_in_time = ready[c] < finish
        if small or (ready_in_time and (wait <= 0 or wait < alpha)):
            cur.append(c)
            cur_bytes += sizes_bytes[c]
        else:
            groups.append(cur)
            prev_end = finish
            cur, cur_bytes = [c], float(sizes_bytes[c])
    groups.append(cur)
    return groups


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
