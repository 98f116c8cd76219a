"""Tensor fusion (Horovod): gradients that become ready within one cycle are
packed into buffers of at most ``threshold_bytes`` and each buffer is
reduced as one message, trading a little waiting for fewer per-message costs.

Horovod's coordinator decides the buffers every cycle at run time. Here the
same packing is computed once from rank 0's measured ready times (see
:mod:`~pushpull.torch.strategies.planned` for why the plan must be agreed),
with cycles counted from the first gradient of the backward pass; at run time
a buffer is flushed as soon as all its gradients are ready (it is "full"),
and whatever is left at the end of the backward pass is flushed then.
Options ``threshold_bytes`` and ``cycle_ms`` override
PUSHPULL_FUSION_THRESHOLD_BYTES / PUSHPULL_FUSION_CYCLE_MS.
"""
from __future__ import annotations

import math

from pushpull.torch import ops
from pushpull.torch.strategies.planned import PlannedStrategy


def fusion_plan(ready_s: list[float], sizes: list[int], threshold_bytes: int, cycle_s: float) -> list[list[int]]:
    """Pack tensors (indices in ready order) into buffers.

    A tensor joins the buffer of the cycle tick that first sees it (tick =
    ready time rounded up to a multiple of ``cycle_s``); within a tick,
    buffers are filled in ready order up to ``threshold_bytes``. A tensor
    larger than the threshold travels alone.
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
        tick = t if cycle_s == 0 else math.ceil(t / cycle_s - 1e-9) * cycle_s
        if cur and (tick != cur_tick or cur_bytes + b > threshold_bytes):
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_tick = tick
        cur_bytes += b
    if cur:
        groups.append(cur)
    return groups


class Fusion(PlannedStrategy):
    name = "fusion"

    def __init__(self, compression=None, threshold_bytes: int | None = None, cycle_ms: float | None = None,
                 **options):
        cfg = ops.config()
        self.threshold_bytes = int(threshold_bytes or cfg.fusion_threshold_bytes)
        self.cycle_s = float(cycle_ms if cycle_ms is not None else cfg.fusion_cycle_ms) / 1e3
        super().__init__(compression, **options)

    def make_plan(self, names, ready_s, sizes):
        return fusion_plan(ready_s, sizes, self.threshold_bytes, self.cycle_s)
