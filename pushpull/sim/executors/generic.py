"""The simulator's executor of a policy that needs nothing of its own (:mod:`pushpull.policy`): the
policy's ``release`` becomes tasks (one per gradient at its ready time, one after the backward pass, or
the buffers of its ``plan`` on the profile's ready times), and a policy that ``schedules`` gets its
partitions queued by priority under its credit, as ByteScheduler's are. A strategy added as one file in
``pushpull/policy`` is simulated through this class."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pushpull.policy.bytescheduler import partitions
from pushpull.sim.config import ClusterConfig
from pushpull.sim.executors.base import CommTask, Discipline, Strategy, StrategyContext, group_name


@dataclass
class PolicyStrategy(Strategy):
    options: dict[str, Any] = field(default_factory=dict)
    policy: ClassVar[Any] = None

    def __post_init__(self):
        unknown = set(self.options) - set(self.policy.options)
        if unknown:
            raise ValueError(f"strategy {self.name}: unknown option(s) {sorted(unknown)}; it takes "
                             f"{sorted(self.policy.options) or 'none'}")
        self.options = {**self.policy.options, **self.options}

    def _sizes(self, cluster: ClusterConfig) -> tuple[int, float]:
        return self.policy.scheduling(cluster.backend, **self.options)

    def discipline(self, cluster: ClusterConfig) -> Discipline:
        if not self.policy.schedules:
            return Discipline()
        credit = self._sizes(cluster)[1]
        return Discipline(by_priority=True, credit_bytes=None if math.isinf(credit) else credit,
                          credit_release="push" if cluster.backend == "ps" else "done")

    def ps_key_bytes(self, cluster: ClusterConfig) -> int:
        return self._sizes(cluster)[0] if self.policy.schedules else cluster.ps_partition_bytes

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:
        ready = [t for t in ctx.ready if t.nbytes > 0]
        if not ready:
            return []
        if self.policy.release == "end":
            return [CommTask(f"{self.name}[all]", ctx.backward_s, [(t.index, t.nbytes) for t in ready])]
        if self.policy.release == "plan":
            t0 = ready[0].ready_s
            groups = self.policy.plan([t.ready_s - t0 for t in ready], [t.nbytes for t in ready], **self.options)
            tasks = []
            for g in groups:
                members = [ready[i] for i in g]
                tasks.append(CommTask(group_name(self.name, len(tasks), members), max(t.ready_s for t in members),
                                      [(t.index, t.nbytes) for t in members]))
            return tasks
        if not self.policy.schedules:
            return [CommTask(t.name, t.ready_s, [(t.index, t.nbytes)]) for t in ready]
        part = self._sizes(ctx.cluster)[0]
        tasks = []
        for t in ready:
            sizes = partitions(t.nbytes, part)
            for j, size in enumerate(sizes):
                tasks.append(CommTask(t.name if len(sizes) == 1 else f"{t.name}.p{j}", t.ready_s,
                                      [(t.index, size)], priority=(t.layer, j, t.pos)))
        return tasks

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        return f"{self.name}({opts})" if opts else self.name


def executor_for(policy) -> type[Strategy]:
    """A simulator Strategy class that carries out ``policy`` (named after it)."""
    return dataclass(type(f"PolicyStrategy[{policy.name}]", (PolicyStrategy,),
                          {"policy": policy, "name": policy.name, "__annotations__": {}}))
