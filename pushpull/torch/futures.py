"""Asynchronous results as ``torch.futures.Future``: the type DDP's communication hooks return.

Why: Horovod-style integer handles only offer ``poll`` and ``synchronize``. Code that wants to chain
work on a result (decompress, scale, copy into a bucket), as PyTorch's DDP comm hooks do with
``Future.then``, needs a future, and until now our own DDP hook reached into the handle table to build
one. :func:`get_future` is that bridge, public, with the guard rail a torch Future lacks: a deadline.
A torch Future never times out and DDP waits on it forever, so an operation that has not finished
within ``timeout`` completes its future with a :class:`PushPullError` naming what it waits on.
"""
from __future__ import annotations

import threading
import time

import torch

from pushpull.torch import ops
from pushpull.worker.handle import PushPullError

__all__ = ["get_future"]


class _Watchdog:
    """One daemon thread that expires the futures whose operation is late (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[float, "_Link"]] = {}
        self._thread: threading.Thread | None = None

    def add(self, link: "_Link", deadline: float) -> None:
        with self._lock:
            self._pending[id(link)] = (deadline, link)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="pushpull-future-watchdog", daemon=True)
                self._thread.start()

    def remove(self, link: "_Link") -> None:
        with self._lock:
            self._pending.pop(id(link), None)

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                late = [link for deadline, link in self._pending.values() if deadline <= now]
            for link in late:
                link.expire()


_watchdog = _Watchdog()


class _Link:
    """Settles one future exactly once: from the operation's completion or from the watchdog."""

    def __init__(self, handle: int, fut: torch.futures.Future, timeout: float, what: str):
        self.handle, self.fut, self.timeout, self.what = handle, fut, timeout, what
        self._lock = threading.Lock()
        self._settled = False

    def _settle(self) -> bool:
        with self._lock:
            if self._settled:
                return False
            self._settled = True
        _watchdog.remove(self)
        return True

    def on_done(self) -> None:
        try:  # finished: this does not block, and it frees the handle even when the future expired
            out, error = ops.synchronize(self.handle, timeout=1.0), None
        except Exception as e:  # noqa: BLE001 - the future carries the operation's error
            out, error = None, e
        if not self._settle():
            return
        if error is not None:
            self.fut.set_exception(error)
        else:
            self.fut.set_result(out)

    def expire(self) -> None:
        if not self._settle():
            return
        self.fut.set_exception(PushPullError(
            f"{self.what} did not finish within {self.timeout:.0f}s (PUSHPULL_TIMEOUT): {ops.describe(self.handle)}"))


def get_future(handle: int, timeout: float | None = None, what: str | None = None) -> torch.futures.Future:
    """A ``torch.futures.Future`` for the operation behind ``handle`` (from ``push_pull_async`` and the
    other ``*_async`` calls). It completes with what ``synchronize(handle)`` returns, or with its error;
    chain work with ``.then(fn)``, block with ``.wait()``. The handle is consumed: do not also
    synchronize it. After ``timeout`` seconds (default PUSHPULL_TIMEOUT) an unfinished operation
    completes the future with a PushPullError that names what it waits for (``what``: how to call the
    operation in that message, default its tensor's name)."""
    timeout = ops.config().timeout if timeout is None else float(timeout)
    fut: torch.futures.Future = torch.futures.Future()
    link = _Link(handle, fut, timeout, what or f"push_pull of tensor {ops.handle_name(handle)!r}")
    _watchdog.add(link, time.monotonic() + timeout)
    ops.when_done(handle, link.on_done)
    return fut
