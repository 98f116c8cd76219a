"""The runtime executor of a policy that needs nothing of its own (:mod:`pushpull.policy`): it carries out
the policy's ``release`` (each gradient when ready, all at the end, or the buffers of its ``plan``) and
asks the backend for the policy's partitioning and credit. A strategy added as one file in
``pushpull/policy`` runs through this class."""
from __future__ import annotations

import torch

from pushpull.torch.executors.base import Strategy
from pushpull.torch.executors.planned import PlannedStrategy


def _split(policy, options: dict) -> tuple[dict, dict]:
    """(the policy's own options, with its defaults filled in; the rest, for the executor)."""
    own = dict(policy.options)
    rest = {}
    for k, v in options.items():
        if k in own:
            own[k] = v
        else:
            rest[k] = v
    return own, rest


class PolicyStrategy(Strategy):
    """``release`` "ready" or "end"."""

    policy = None  # set by executor_for()

    def __init__(self, compression=None, **options):
        self.policy_options, rest = _split(self.policy, options)
        self._held: dict[str, tuple[torch.Tensor, int]] = {}
        super().__init__(compression, **rest)

    def scheduling(self) -> tuple[int, int]:
        if not self.policy.schedules:
            return self.comm.default_scheduling()
        part, credit = self.policy.scheduling(self.comm.backend, **self.policy_options)
        return int(part), int(credit)

    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        if self.policy.release == "end":
            self._held[name] = (grad, priority)
        else:
            self._launch(name, [(name, grad)], priority)

    def on_backward_done(self) -> None:
        self._flush()

    def reset(self) -> None:
        super().reset()
        self._held.clear()

    def _flush(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, {}
        members = [(n, held[n][0]) for n in sorted(held)]  # the same layout on every worker
        self._launch_packed(self.name, members, max(p for _, p in held.values()))


class PlannedPolicyStrategy(PlannedStrategy):
    """``release`` "plan": the policy's pure ``plan`` on rank 0's measured ready times."""

    policy = None

    def __init__(self, compression=None, **options):
        self.policy_options, rest = _split(self.policy, options)
        super().__init__(compression, **rest)

    def scheduling(self) -> tuple[int, int]:
        return PolicyStrategy.scheduling(self)

    def make_plan(self, names, ready_s, sizes):
        return self.policy.plan(ready_s, sizes, **self.policy_options)


def executor_for(policy) -> type[Strategy]:
    """A Strategy class that carries out ``policy`` (named after it)."""
    base = PlannedPolicyStrategy if policy.release == "plan" else PolicyStrategy
    return type(f"{base.__name__}[{policy.name}]", (base,), {"policy": policy, "name": policy.name})
