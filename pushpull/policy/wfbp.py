"""WFBP (wait-free backpropagation): each gradient is reduced on its own as soon as it is ready,
overlapping communication with the rest of the backward pass, first come first served. The backend keeps
its default partitioning and credit. The reference every other strategy's speedup is quoted against. Both executors are the generic ones
(``release = "ready"``)."""
from __future__ import annotations

from pushpull.policy.base import Policy


class WFBP(Policy):
    """one reduction per gradient as soon as it is ready"""
    name = "wfbp"
    aliases = ("fifo", "baseline")
    order = 20
    release = "ready"
