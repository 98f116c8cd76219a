"""The simulator's executors of the communication strategies of :mod:`pushpull.policy` (where each
strategy's decisions live once, shared with the runtime); ``make_strategy`` builds one by name. A policy
without a simulator executor of its own runs through :mod:`.generic`; one of its own registers itself for the
policy's name (:func:`pushpull.policy.register_executor`) and is imported here."""
from __future__ import annotations

from pushpull import policy
from pushpull.sim.executors.base import CommTask, Discipline, ReadyTensor, Strategy, StrategyContext
from pushpull.sim.executors.bytescheduler import ByteScheduler
from pushpull.sim.executors.fusion import Fusion
from pushpull.sim.executors.mgwfbp import MGWFBP, mgwfbp_merge

# name -> executor class, for every strategy the simulator runs (kept current by _sync: a policy file added
# later is picked up at the next make_strategy)
STRATEGIES: dict[str, type[Strategy]] = {}


def _executor(pol) -> type[Strategy]:
    if pol.simulator is None:
        from pushpull.sim.executors.generic import executor_for
        return executor_for(pol)
    return policy.executor(pol.name, "simulator")


def _sync() -> dict[str, type[Strategy]]:
    want = [p for p in policy.all_policies() if p.simulator != "-"]
    if [n for n in STRATEGIES] != [p.name for p in want]:
        old = dict(STRATEGIES)
        STRATEGIES.clear()
        for p in want:
            STRATEGIES[p.name] = old.get(p.name) or _executor(p)
    return STRATEGIES


_sync()
BSP = STRATEGIES["bsp"]    # the generic executor of pushpull/policy/bsp.py
WFBP = STRATEGIES["wfbp"]  # ... and of pushpull/policy/wfbp.py


def make_strategy(spec: "str | Strategy", **kwargs) -> Strategy:
    """``"bytescheduler"`` (plus keyword options) or an instance -> a Strategy."""
    if isinstance(spec, Strategy):
        if kwargs:
            raise ValueError(f"strategy: options {sorted(kwargs)} given with a Strategy instance")
        return spec
    _sync()
    try:
        key = policy.get(spec).name
    except ValueError:
        key = None
    if key not in STRATEGIES:
        raise ValueError(f"strategy: unknown {spec!r}; choose from {', '.join(STRATEGIES)}")
    cls = STRATEGIES[key]
    if getattr(cls, "policy", None) is not None and any(k in cls.policy.options for k in kwargs):
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in cls.policy.options}
        kwargs["options"] = own
    return cls(**kwargs)


__all__ = ["BSP", "WFBP", "Fusion", "MGWFBP", "ByteScheduler", "mgwfbp_merge", "make_strategy",
           "STRATEGIES", "CommTask", "Discipline", "ReadyTensor", "Strategy", "StrategyContext"]
