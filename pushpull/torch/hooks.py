"""Step callbacks of pushpull's optimizer wrappers (DistributedOptimizer, ScheduledOptimizer, AsyncOptimizer).

Why not ``torch.optim.Optimizer.register_step_post_hook``: the wrappers are subclasses of the user's
optimizer class whose ``step`` calls the original one, and torch runs post hooks around both, so such a
hook fires twice per step. A callback registered here runs once, after the whole step (update included).
The auto-tuner times steps with it; a user can log or checkpoint with it.
"""
from __future__ import annotations

from typing import Callable

from pushpull import metrics
from pushpull.worker import trace as _trace

_ATTR = "_pushpull_step_callbacks"


def register_step_callback(self, fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn()`` after every ``step()`` of this optimizer; returns a function that removes it."""
    if not callable(fn):
        raise TypeError(f"register_step_callback expects a callable, got {type(fn).__name__}")
    callbacks = self.__dict__.setdefault(_ATTR, [])
    callbacks.append(fn)

    def remove() -> None:
        if fn in callbacks:
            callbacks.remove(fn)
    return remove


def run_step_callbacks(opt) -> None:
    for fn in list(opt.__dict__.get(_ATTR, ())):
        fn()


def step_done(opt) -> None:
    """A wrapper's ``step()`` ended: the timeline (PUSHPULL_TRACE_ON) counts one step, unless the program
    counts them itself with ``trace_step()``, then the registered callbacks run. One function for every
    wrapper, so that each of them opens and closes the traced window (layer-wise and asynchronous training
    included)."""
    if _trace.TRACER is not None:
        _trace.TRACER.end_step()
    metrics.step_done()
    inner = opt.__dict__.get("_inner")
    if inner is not None:
        # the wrapped optimizer stepped, through its wrapper: a learning-rate scheduler built on it (before
        # wrapping, the usual order) checks this flag and would otherwise warn that it was stepped first
        inner._opt_called = True
    run_step_callbacks(opt)
