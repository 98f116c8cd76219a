"""Shared machinery of the strategies that fuse gradients by a plan (fusion,
MG-WFBP): measure when each gradient becomes ready, agree on one
measurement, fix the buffers, then launch each buffer as soon as all of its
gradients are ready.

Why a plan agreed from rank 0: a fused buffer is one reduction, so every
worker must pack exactly the same gradients into it. Deciding from local
arrival times would give each worker its own buffers (different sizes under
the same name: a shape error over PS, a wrong sum over all-reduce). So for
``warmup_steps`` steps everything is reduced as one buffer (BSP) while the
ready times are recorded; then rank 0's times are broadcast (a sum to which
the others add zeros, exact) and every worker computes the same plan from the
same numbers with the same pure function.
"""
from __future__ import annotations

import statistics
import time

import torch

from pushpull.torch import ops
from pushpull.torch.executors.base import Strategy


class PlannedStrategy(Strategy):
    """Subclasses implement :meth:`make_plan`."""

    def __init__(self, compression=None, warmup_steps: int | None = None, **options):
        super().__init__(compression, **options)
        self.warmup_steps = int(warmup_steps or ops.config().strategy_warmup_steps)
        if self.warmup_steps < 1:
            raise ValueError(f"{self.name}: warmup_steps must be >= 1, got {warmup_steps}")
        self.step = 0
        self.plan: list[list[str]] | None = None   # buffers, in launch order, of gradient names
        self._group_of: dict[str, int] = {}
        self._missing: list[set] = []
        self._t0: float | None = None
        self._held: dict[str, tuple[torch.Tensor, int]] = {}
        self._times: dict[str, list[float]] = {}
        self._sizes: dict[str, int] = {}

    # ------------------------------------------------------------ to implement --
    def make_plan(self, names: list[str], ready_s: list[float], sizes: list[int]) -> list[list[int]]:
        """Group gradients (given in ready order with their agreed ready times and
        byte sizes) into buffers; return lists of indices, in launch order."""
        raise NotImplementedError

    def agreed_extra(self) -> list[float]:
        """Numbers (e.g. a measured cost model) to broadcast from rank 0 with the times."""
        return []

    def use_extra(self, values: list[float]) -> None:
        pass

    # ------------------------------------------------------------ strategy --
    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        self._held[name] = (grad, priority)
        if self.plan is None:
            self._times.setdefault(name, []).append(now - self._t0)
            self._sizes[name] = grad.numel() * grad.element_size()
            return
        g = self._group_of.get(name)
        if g is None:  # not in the plan (a gradient that was absent in warm-up): alone
            del self._held[name]
            self._launch(name, [(name, grad)], priority)
            return
        missing = self._missing[g]
        missing.discard(name)
        if not missing:
            self._launch_group(g)

    def _launch_group(self, g: int) -> None:
        members = [(n, self._held.pop(n)) for n in self.plan[g]]  # type: ignore[index]
        self._launch_packed(self.name, [(n, gp[0]) for n, gp in members],
                            max(gp[1] for _, gp in members))

    def _flush(self) -> None:
        if not self._held:
            return
        if self.plan is None:
            held, self._held = self._held, {}
            members = [(n, held[n][0]) for n in sorted(held)]
            self._launch_packed(f"{self.name}.warmup", members, max(p for _, p in held.values()))
            return
        # buffers with a gradient missing this step: send what is there one by one
        # (every worker misses the same ones, or the reduction reports a mismatch)
        for n in sorted(self._held):
            grad, prio = self._held.pop(n)
            self._launch(n, [(n, grad)], prio)

    def reset(self) -> None:
        super().reset()
        self._held.clear()
        self._t0 = None
        if self.plan is not None:
            self._missing = [set(g) for g in self.plan]

    def on_backward_done(self) -> None:
        self._flush()
        self._t0 = None
        self.step += 1
        if self.plan is None and self.step >= self.warmup_steps:
            self._agree_and_plan()
        if self.plan is not None:
            self._missing = [set(g) for g in self.plan]

    # ------------------------------------------------------------ planning --
    def plan_now(self, times: dict[str, list[float]], sizes: dict[str, int]) -> None:
        """Plan from ready times measured elsewhere (per gradient, one per step; the first step is
        dropped) instead of measuring for ``warmup_steps`` steps: the ``auto`` strategy has already
        measured them. A collective (rank 0's times are broadcast): every rank calls it between steps."""
        self._times = {n: list(v) for n, v in times.items()}
        self._sizes = dict(sizes)
        self.step = max(self.step, self.warmup_steps)
        self._agree_and_plan()
        if self.plan is not None:
            self._missing = [set(g) for g in self.plan]

    def _agree_and_plan(self) -> None:
        names = sorted(self._times)
        if not names:
            return
        per_step = [self._times[n][1:] or self._times[n] for n in names]  # drop the first step when we can
        mine = [statistics.median(ts) for ts in per_step]
        extra = self.agreed_extra()
        vec = torch.tensor(mine + extra + [float(len(names))], dtype=torch.float64)
        self.comm.broadcast_from_root(vec, f"{self.name}.plan[{names[0]}+{len(names) - 1}]")
        vals = vec.tolist()
        if int(vals[-1]) != len(names):
            raise RuntimeError(f"{self.name}: rank 0 planned for {int(vals[-1])} gradients, this rank has "
                               f"{len(names)}; every worker must reduce the same gradients")
        ready = vals[:len(names)]
        self.use_extra(vals[len(names):-1])
        order = sorted(range(len(names)), key=lambda i: (ready[i], names[i]))
        sizes = [self._sizes[names[i]] for i in order]
        groups = self.make_plan([names[i] for i in order], [ready[i] for i in order], sizes)
        covered = sorted(i for g in groups for i in g)
        if covered != list(range(len(order))):
            raise AssertionError(f"{self.name}: plan does not cover every gradient exactly once")
        self.plan = [[names[order[i]] for i in g] for g in groups if g]
        self._group_of = {n: gi for gi, g in enumerate(self.plan) for n in g}
        self._times.clear()

    def describe_plan(self) -> str:
        if self.plan is None:
            return f"{self.name}: measuring (step {self.step} of {self.warmup_steps})"
        sizes = [len(g) for g in self.plan]
        return f"{self.name}: {len(self.plan)} buffer(s) of {sizes} gradients"
