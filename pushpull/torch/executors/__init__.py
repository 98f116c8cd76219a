"""Communication strategies: what happens to a gradient once autograd has
produced it. :func:`make_strategy` picks one by name (``PUSHPULL_STRATEGY`` or
``DistributedOptimizer(..., strategy=...)``) from the registry of
:mod:`pushpull.policy`, where each strategy's decisions live once; this package
carries them out on real tensors (a policy without an executor of its own runs
through :mod:`.generic`; one of its own registers itself for the policy's name,
:func:`pushpull.policy.register_executor`). The DistributedOptimizer only talks to the
:class:`~pushpull.torch.executors.base.Strategy` interface, and every
strategy runs over both backends (``PUSHPULL_BACKEND=ps | allreduce``)."""
from __future__ import annotations

import importlib

from pushpull import policy
from pushpull.torch.executors.base import Strategy

_OVERRIDES: dict[str, str] = {}  # name -> "module:Class", set by register()


def register(name: str, target: str) -> None:
    """Run strategy ``name`` with the executor ``target`` ("module:Class") instead of its policy's."""
    _OVERRIDES[name] = target


def names() -> list[str]:
    """The strategies that run here, sorted."""
    return sorted({p.name for p in policy.all_policies() if p.runtime != "-"} | set(_OVERRIDES))


def strategy_class(name: str) -> type[Strategy]:
    """The executor class of strategy ``name`` (or one of its aliases)."""
    target = _OVERRIDES.get(name)
    if target is None:
        try:
            pol = policy.get(name)
        except ValueError:
            raise ValueError(f"unknown strategy {name!r}; PUSHPULL_STRATEGY accepts {', '.join(names())}") from None
        if pol.runtime == "-":
            raise ValueError(f"strategy {name!r} exists only in the simulator; PUSHPULL_STRATEGY accepts "
                             f"{', '.join(names())}")
        if pol.runtime is None:
            from pushpull.torch.executors.generic import executor_for
            return executor_for(pol)
        return policy.executor(pol.name, "runtime")
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def make_strategy(name: str, **kwargs) -> Strategy:
    return strategy_class(name)(**kwargs)


# every executor of its own, registered for its policy's name (policy.executor imports this package for them)
from pushpull.torch.executors import auto, bytescheduler, fusion, mgwfbp  # noqa: E402,F401
