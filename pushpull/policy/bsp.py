"""BSP: hold every gradient until the backward pass is over, then reduce them all as one flat buffer.
No overlap with backward, one message: the baseline that shows what overlap buys. The buffer's layout
is sorted by name, so it is the same on every worker whatever order autograd produced the gradients in.
Both executors are the generic ones (``release = "end"``)."""
from __future__ import annotations

from pushpull.policy.base import Policy


class BSP(Policy):
    """one buffer after the backward pass (no overlap)"""
    name = "bsp"
    order = 10
    release = "end"
