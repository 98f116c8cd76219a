"""A finished Handle lets go of its owner's closures: they refer to the operation, which refers to the handle, and
the cycle kept each operation's buffers (a gradient, its output) alive until Python's cyclic collector ran."""
from __future__ import annotations

import gc
import weakref

from pushpull.worker.handle import Handle


class _Op:
    """Stands in for the engine's operation: it holds its handle and a buffer."""

    def __init__(self):
        self.handle = Handle("t", None)
        self.buffer = bytearray(1 << 20)


def _submitted() -> tuple[weakref.ref, Handle]:
    op = _Op()
    op.handle._describe = lambda: f"waits on {op!r}"
    op.handle._abandon = lambda why: op
    return weakref.ref(op), op.handle


def test_a_finished_handle_drops_its_owner_without_the_cycle_collector():
    gc.disable()
    try:
        op, handle = _submitted()
        handle._finish()
        del handle
        assert op() is None  # freed by reference counting alone
    finally:
        gc.enable()


def test_a_pending_handle_still_describes_what_it_waits_on():
    op, handle = _submitted()
    assert handle.describe().startswith("waits on")


def test_a_finished_handle_describes_no_reply():
    _, handle = _submitted()
    handle._finish()
    assert handle.describe() == "no reply"
