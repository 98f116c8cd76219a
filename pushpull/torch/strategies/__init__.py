"""Communication strategies: what happens to a gradient once autograd has
produced it. One small file per strategy; :func:`make_strategy` picks one by
name (``PUSHPULL_STRATEGY`` or ``DistributedOptimizer(..., strategy=...)``).
The DistributedOptimizer only talks to the
:class:`~pushpull.torch.strategies.base.Strategy` interface, and every
strategy runs over both backends (``PUSHPULL_BACKEND=ps | allreduce``)."""
from __future__ import annotations

from pushpull.torch.strategies.base import Strategy

_REGISTRY = {
    "bsp": "pushpull.torch.strategies.bsp:BSP",
    "wfbp": "pushpull.torch.strategies.wfbp:WFBP",
    "fusion": "pushpull.torch.strategies.fusion:Fusion",
    "mgwfbp": "pushpull.torch.strategies.mgwfbp:MGWFBP",
    "bytescheduler": "pushpull.torch.strategies.bytescheduler:ByteScheduler",
    "auto": "pushpull.torch.strategies.auto:Auto",
}


def register(name: str, target: str) -> None:
    _REGISTRY[name] = target


def names() -> list[str]:
    return sorted(_REGISTRY)


def make_strategy(name: str, **kwargs) -> Strategy:
    import importlib

    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; PUSHPULL_STRATEGY accepts {', '.join(names())}") from None
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)(**kwargs)
