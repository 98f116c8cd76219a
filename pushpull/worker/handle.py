"""Asynchronous handles returned by push_pull_async."""
from __future__ import annotations

import threading
import time
from typing import Callable


class PushPullError(RuntimeError):
    """A push_pull failed; the message names the tensor and the cause."""


class Handle:
    """Completion of one push_pull; thread-safe. ``describe`` says what it waits on."""

    def __init__(self, name: str, output, describe: Callable[[], str] | None = None):
        self.name = name
        self.output = output
        self.error: str | None = None
        self._event = threading.Event()
        self._callbacks: list[Callable[["Handle"], None]] = []
        self._lock = threading.Lock()
        self._describe = describe
        self.submitted = time.monotonic()

    def done(self) -> bool:
        return self._event.is_set()

    def add_done_callback(self, fn: Callable[["Handle"], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def wait(self, timeout: float):
        if not self._event.wait(timeout):
            what = self._describe() if self._describe else "no reply"
            raise PushPullError(f"push_pull of tensor {self.name!r} did not finish within {timeout:.0f}s "
                                f"(PUSHPULL_TIMEOUT): {what}")
        if self.error is not None:
            raise PushPullError(self.error)
        return self.output

    def wait_alive(self, timeout: float, failure: Callable[[], str | None], op: str = "push_pull"):
        """Wait up to ``timeout`` s, checking ``failure()`` (e.g. a dead cluster) four times a
        second, so that a waiter learns of a failure at once instead of at the timeout."""
        deadline = time.monotonic() + timeout
        while not self.done():
            reason = failure()
            if reason:
                raise PushPullError(f"{op} of tensor {self.name!r}: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                what = self._describe() if self._describe else "no reply"
                raise PushPullError(f"{op} of tensor {self.name!r} did not finish within {timeout:.0f}s "
                                    f"(PUSHPULL_TIMEOUT): {what}")
            self._event.wait(min(left, 0.25))
        return self.wait(0.0)

    def _finish(self, error: str | None = None) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.error = error
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def complete(self) -> None:
        self._finish(None)

    def fail(self, error: str) -> None:
        self._finish(error)
