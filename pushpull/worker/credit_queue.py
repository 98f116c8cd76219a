"""Priority queue with a credit window (ByteScheduler's core idea).

Partitions of all in-flight tensors wait in one queue ordered by priority
(larger = more urgent; the training API uses minus the layer's forward index,
so the layer nearest the input goes first), then partition index, then arrival.
A partition starts while the bytes in flight are under the credit; its
completion returns the credit. Nothing in flight is interrupted: "preemption"
means that a late, urgent partition overtakes everything still queued. Bytes in
flight therefore never exceed the credit plus one partition.

``by_priority`` False keeps the queue in arrival order (ready order) instead: the engine's own window
(``BYTEPS_SCHEDULING_CREDIT=auto``) only paces, and a priority order there reorders each worker's pushes
by when its credit happened to free up, which differs between workers, so a key's round waits for the
worker that sent it last (docs/results/line_rate.md, "Why the PS lost at 1 Gbit/s").
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class CreditQueue(Generic[T]):
    def __init__(self, credit_bytes: int = 0, by_priority: bool = True):
        """``credit_bytes`` = 0 means unlimited (scheduling off, FIFO by priority only)."""
        self.credit_bytes = credit_bytes
        self.by_priority = by_priority
        self.in_flight = 0
        self.max_in_flight = 0
        self._heap: list = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def queued(self) -> list[T]:
        """The items still waiting for credit (none started), in no particular order."""
        return [entry[-1] for entry in self._heap]

    def push(self, item: T, nbytes: int, priority: int = 0, part: int = 0) -> None:
        if self.by_priority:
            heapq.heappush(self._heap, (-priority, part, next(self._seq), nbytes, item))
        else:
            heapq.heappush(self._heap, (0, 0, next(self._seq), nbytes, item))

    def admit(self, start: Callable[[T, int], None]) -> int:
        """Start queued items while credit allows; returns how many started."""
        n = 0
        while self._heap and (self.credit_bytes <= 0 or self.in_flight < self.credit_bytes):
            _, _, _, nbytes, item = heapq.heappop(self._heap)
            self.in_flight += nbytes
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            n += 1
            start(item, nbytes)
        return n

    def release(self, nbytes: int) -> None:
        self.in_flight -= nbytes
        if self.in_flight < 0:
            raise AssertionError("credit released twice")
