"""The default credit window (``BYTEPS_SCHEDULING_CREDIT=auto``), sized from
bandwidth x delay as the job runs.

Why a window at all: with every key in flight, a worker's kernel holds megabytes
spread over one TCP flow per server, the flows progress unevenly, and a key's
round completes only at its slowest push, so pulls pile up at the end of the
step. Why not a fixed one: the window must cover the path's bandwidth-delay
product, or the link idles while acknowledgements travel (one key per server,
256 KB on the emulated grid, cost 10 % at 200 Mbit/s with a 10 ms RTT).

How: BBR's idea at the level of partitions. Each acknowledged push gives a
round-trip time (sent -> PUSH_ACK) and a delivery rate, as TCP estimates it:
the bytes acknowledged while it was in flight / that time (bytes in flight /
time would count the other servers' flows as this one's, and overestimate the
rate k-fold when a push slips ahead of them). The window is twice the best rate
times the smallest round trip seen in the last ``HORIZON_S`` seconds (enough to
keep the pipe full with one bandwidth-delay product of slack), never below
``floor`` (one partition per server, at least two) nor above ``cap``. With a
short path the floor rules; with a long one the window grows to the product.
"""
from __future__ import annotations

import time

HORIZON_S = 10.0  # minima and maxima are kept over two half-horizons, so old samples age out
GAIN = 2.0


class AutoWindow:
    def __init__(self, floor: int, cap: int, clock=time.perf_counter):
        self.floor, self.cap = int(floor), int(max(cap, floor))
        self.bytes = self.floor
        self._clock = clock
        self._start = clock()
        self._rtt = [float("inf"), float("inf")]  # min round trip: this half-horizon, the previous one
        self._rate = [0.0, 0.0]                   # max delivery rate (bytes/s), same halves

    def on_ack(self, delivered: int, rtt_s: float) -> int:
        """One acknowledged push: ``delivered`` = bytes acknowledged from its send to its own
        acknowledgement (itself included), ``rtt_s`` = that time. Returns the new window in bytes."""
        if rtt_s <= 0:
            return self.bytes
        now = self._clock()
        if now - self._start > HORIZON_S / 2:
            self._start = now
            self._rtt = [float("inf"), self._rtt[0]]
            self._rate = [0.0, self._rate[0]]
        self._rtt[0] = min(self._rtt[0], rtt_s)
        self._rate[0] = max(self._rate[0], delivered / rtt_s)
        bdp = max(self._rate) * min(self._rtt)
        self.bytes = int(min(self.cap, max(self.floor, GAIN * bdp)))
        return self.bytes
