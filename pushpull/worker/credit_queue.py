"""Priority queue with a credit window (ByteScheduler's core idea).

Partitions of all in-flight tensors wait in one queue ordered by priority
(larger = more urgent; the training API uses minus the layer's forward index,
so the layer nearest the input goes first), then partition index, then arrival.
A partition starts while the bytes in flight are under the credit; its
completion returns the credit. Nothing in flight is interrupted: "preemption"
means that a late, urgent partition overtakes everything still queued. Bytes in
flight therefore never exceed the credit plus one partition.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class CreditQueue(Generic[T]):
    def __init__(self, credit_bytes: int = 0):
        """``credit_bytes`` = 0 means unlimited (scheduling off, FIFO by priority only)."""
        self.credit_bytes = credit_bytes
        self.in_flight = 0
        self.max_in_flight = 0
        self._heap: list = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: T, nbytes: int, priority: int = 0, part: int = 0) -> None:
        heapq.heappush(self._heap, (-priority, part, next(self._seq), nbytes, item))

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
