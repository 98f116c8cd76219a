"""auto: measure this job's compute and network during the first steps, let the simulator predict every
fixed strategy (and both backends where it may switch), confirm the best on the live job and keep it
(:mod:`pushpull.torch.executors.auto`). A runtime strategy only: the simulator predicts the strategies
auto chooses among, not auto itself."""
from __future__ import annotations

from pushpull.policy.base import ABSENT, OWN, Policy


class Auto(Policy):
    """pick the backend and strategy from measurements and the simulator"""
    name = "auto"
    order = 60
    fixed = False
    runtime = OWN
    simulator = ABSENT
