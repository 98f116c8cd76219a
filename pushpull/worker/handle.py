"""Asynchronous handles returned by push_pull_async."""
from __future__ import annotations

import threading
import time
from typing import Callable


class PushPullError(RuntimeError):
    """A push_pull failed; the message names the tensor and the cause."""


class WorkersChanged(PushPullError):
    """Elastic training: a worker left and the job goes on without it. Operations in flight were dropped;
    ``pushpull.torch.elastic.run`` restores the last committed state and calls the training function again."""


class Handle:
    """Completion of one push_pull; thread-safe. ``describe`` says what it waits on."""

    # a handle per tensor per step: a plain lock held until completion is the latch (an Event
    # builds a Condition, an RLock and a deque, and notifies through them); one lock shared by all
    # handles guards the rare done-callbacks
    __slots__ = ("name", "output", "error", "error_type", "_done", "_latch", "_callbacks", "_describe", "submitted",
                 "_abandon")
    _callbacks_lock = threading.Lock()

    def __init__(self, name: str, output, describe: Callable[[], str] | None = None):
        self.name = name
        self.output = output
        self.error: str | None = None
        self.error_type: type = PushPullError
        self._done = False
        self._latch = threading.Lock()
        self._latch.acquire()
        self._callbacks: list[Callable[["Handle"], None]] | None = None
        self._describe = describe
        self.submitted = time.monotonic()
        self._abandon: Callable[[str], None] | None = None  # the owner's: fail the operation everywhere

    def abandon(self, why: str) -> None:
        """The caller gave up on this operation (its deadline passed, ``why``): the owner (the engine) fails
        it on every rank, so that no later call of the same tensor can meet its data. Once; not once done."""
        fn, self._abandon = self._abandon, None
        if fn is not None and not self._done:
            fn(why)

    def done(self) -> bool:
        return self._done

    def describe(self) -> str:
        """What the operation waits on (its owner's account), or "no reply"; read once, since completion clears
        it from another thread."""
        fn = self._describe
        return fn() if fn is not None else "no reply"

    def add_done_callback(self, fn: Callable[["Handle"], None]) -> None:
        with Handle._callbacks_lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _wait_done(self, timeout: float) -> bool:
        """True once complete; waiters pass the latch on to each other."""
        if self._done:
            return True
        if self._latch.acquire(timeout=max(0.0, timeout)):
            self._latch.release()
            return True
        return self._done

    def wait(self, timeout: float):
        if not self._wait_done(timeout):
            text = (f"push_pull of tensor {self.name!r} did not finish within {timeout:.0f}s (PUSHPULL_TIMEOUT): "
                    f"{self.describe()}")
            self.abandon(text)
            raise PushPullError(text)
        if self.error is not None:
            raise self.error_type(self.error)
        return self.output

    def wait_alive(self, timeout: float, failure: Callable[[], str | None], op: str = "push_pull",
                   limit: float | None = None):
        """Wait up to ``timeout`` s, checking ``failure()`` (e.g. a dead cluster) four times a
        second, so that a waiter learns of a failure at once instead of at the timeout. ``limit``: the
        operation's whole deadline, for the message, when ``timeout`` is what was left of it."""
        deadline = time.monotonic() + timeout
        while not self.done():
            reason = failure()
            if reason:
                raise PushPullError(f"{op} of tensor {self.name!r}: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                text = (f"{op} of tensor {self.name!r} did not finish within "
                        f"{timeout if limit is None else limit:.0f}s (PUSHPULL_TIMEOUT): {self.describe()}")
                self.abandon(text)
                raise PushPullError(text)
            self._wait_done(min(left, 0.25))
        return self.wait(0.0)

    def _finish(self, error: str | None = None, exc: type = PushPullError) -> None:
        with Handle._callbacks_lock:
            if self._done:
                return
            self.error = error
            self.error_type = exc
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
            # the owner's closures refer to its operation, which refers to this handle: a reference cycle that
            # would keep the operation's buffers (a gradient, its output) alive until Python's cyclic garbage
            # collector ran, gigabytes for a large model; done, neither is called again
            self._describe = self._abandon = None
        self._latch.release()
        for fn in callbacks or ():
            fn(self)

    def complete(self) -> None:
        self._finish(None)

    def fail(self, error: str, exc: type = PushPullError) -> None:
        self._finish(error, exc)
