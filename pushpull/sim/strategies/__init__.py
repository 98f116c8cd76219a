"""Communication strategies, one small file each; ``make_strategy`` builds one by name."""
from __future__ import annotations

from pushpull.sim.strategies.base import CommTask, Discipline, ReadyTensor, Strategy, StrategyContext
from pushpull.sim.strategies.bsp import BSP
from pushpull.sim.strategies.bytescheduler import ByteScheduler
from pushpull.sim.strategies.fusion import Fusion
from pushpull.sim.strategies.mgwfbp import MGWFBP, mgwfbp_merge
from pushpull.sim.strategies.wfbp import WFBP

STRATEGIES: dict[str, type[Strategy]] = {
    "bsp": BSP, "wfbp": WFBP, "fusion": Fusion, "mgwfbp": MGWFBP, "bytescheduler": ByteScheduler,
}

ALIASES = {
    "fifo": "wfbp", "horovod": "fusion", "tensor_fusion": "fusion", "mg-wfbp": "mgwfbp",
    "bs": "bytescheduler", "scheduled": "bytescheduler", "priority": "bytescheduler",
    "baseline": "wfbp",
}


def make_strategy(spec: "str | Strategy", **kwargs) -> Strategy:
    """``"bytescheduler"`` (plus keyword options) or an instance -> a Strategy."""
    if isinstance(spec, Strategy):
        if kwargs:
            raise ValueError(f"strategy: options {sorted(kwargs)} given with a Strategy instance")
        return spec
    key = str(spec).strip().lower()
    key = ALIASES.get(key, key)
    if key not in STRATEGIES:
        raise ValueError(f"strategy: unknown {spec!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[key](**kwargs)


__all__ = ["BSP", "WFBP", "Fusion", "MGWFBP", "ByteScheduler", "mgwfbp_merge", "make_strategy",
           "STRATEGIES", "CommTask", "Discipline", "ReadyTensor", "Strategy", "StrategyContext"]
