"""Tensor fusion (Horovod): gradients that become ready within one cycle are
packed into buffers of at most ``threshold_bytes`` and each buffer is
reduced as one message, trading a little waiting for fewer per-message costs.

Horovod's coordinator decides the buffers every cycle at run time. Here the
same packing is computed once from rank 0's measured ready times (see
:mod:`~pushpull.torch.executors.planned` for why the plan must be agreed),
with cycles counted from the first gradient of the backward pass; at run time
a buffer is flushed as soon as all its gradients are ready (it is "full"),
and whatever is left at the end of the backward pass is flushed then.
Options ``threshold_bytes`` and ``cycle_ms`` override
PUSHPULL_FUSION_THRESHOLD_BYTES / PUSHPULL_FUSION_CYCLE_MS. The packing itself is the pure
:func:`pushpull.policy.fusion.fusion_plan`, which the simulator runs too.
"""
from __future__ import annotations

from pushpull.policy import register_executor
from pushpull.policy.fusion import fusion_plan
from pushpull.torch import ops
from pushpull.torch.executors.planned import PlannedStrategy


__all__ = ["Fusion"]


@register_executor("fusion", "runtime")
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
