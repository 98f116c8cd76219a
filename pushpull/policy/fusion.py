"""Tensor fusion (Horovod): gradients that become ready within one cycle are packed into buffers of at
most ``threshold_bytes`` and each buffer is reduced as one message, trading a little waiting for fewer
per-message costs.

Horovod's coordinator decides the buffers every cycle at run time. pushpull computes the same packing
once from the ready times (the runtime: rank 0's, measured in warm-up steps; the simulator: the
profile's), with cycles counted from the first gradient of the backward pass; a buffer leaves when all
its gradients are ready. A tensor larger than the threshold travels alone.
"""
from __future__ import annotations

import math

from pushpull.policy.base import OWN, Policy

THRESHOLD_BYTES = 64 * 1024 * 1024  # Horovod's HOROVOD_FUSION_THRESHOLD default
CYCLE_MS = 1.0                       # pushpull's default cycle (Horovod's HOROVOD_CYCLE_TIME is 1-5 ms)


def cycle_tick(ready_s: float, cycle_s: float) -> float:
    """The cycle tick that first sees a gradient ready at ``ready_s`` (its own time when cycle_s is 0)."""
    return ready_s if cycle_s == 0 else math.ceil(ready_s / cycle_s - 1e-9) * cycle_s


def fusion_plan(ready_s: list[float], sizes: list[int], threshold_bytes: int, cycle_s: float) -> list[list[int]]:
    """Pack tensors (indices in ready order) into buffers.

    A tensor joins the buffer of the cycle tick that first sees it (tick = ready time rounded up to a
    multiple of ``cycle_s``); within a tick, buffers are filled in ready order up to ``threshold_bytes``.
    A tensor larger than the threshold travels alone.
    """
    if len(ready_s) != len(sizes):
        raise ValueError(f"fusion_plan: {len(ready_s)} ready times but {len(sizes)} sizes")
    if threshold_bytes < 1 or not cycle_s >= 0:
        raise ValueError(f"fusion_plan: threshold_bytes must be >= 1 and cycle_s >= 0, got "
                         f"{threshold_bytes}, {cycle_s}")
    groups: list[list[int]] = []
    cur: list[int] = []
    cur_tick = None
    cur_bytes = 0
    for i, (t, b) in enumerate(zip(ready_s, sizes)):
        tick = cycle_tick(t, cycle_s)
        if cur and (tick != cur_tick or cur_bytes + b > threshold_bytes):
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_tick = tick
        cur_bytes += b
    if cur:
        groups.append(cur)
    return groups


class Fusion(Policy):
    """buffers of the gradients ready within one cycle, up to a threshold (Horovod)"""
    name = "fusion"
    aliases = ("horovod", "tensor_fusion")
    order = 30
    release = "plan"
    options = {"threshold_bytes": THRESHOLD_BYTES, "cycle_ms": CYCLE_MS}
    runtime = OWN
    simulator = OWN

    @classmethod
    def plan(cls, ready_s, sizes, threshold_bytes: int = THRESHOLD_BYTES, cycle_ms: float = CYCLE_MS, **_):
        return fusion_plan(ready_s, sizes, int(threshold_bytes), float(cycle_ms) / 1e3)
