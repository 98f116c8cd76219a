"""The default credit window (``BYTEPS_SCHEDULING_CREDIT=auto``), sized from
bandwidth x delay as the job runs.

Why a window at all: with every key in flight, a worker's kernel holds megabytes
spread over one TCP flow per server, the flows progress unevenly, and a key's
round completes only at its slowest push, so pulls pile up at the end of the
step. Why not a fixed one: the window must cover the path's bandwidth-delay
product, or the link idles while acknowledgements travel (one key per server,
256 KB on the emulated grid, cost 10 % at 200 Mbit/s with a 10 ms RTT).

How: BBR's idea at the level of partitions. Each acknowledged push gives a
round-trip time (sent -> PUSH_ACK); the delivery rate is the bytes acknowledged
over the last ``SPAN`` windows' worth of acknowledgements divided by the time
they took. Why over that many bytes and not per push (bytes acknowledged while
that push was in flight / its round trip, as before): acknowledgements come in
bunches (a server answers the pushes it read in one pass together, TCP delivers
in bursts, four servers' answers cross), and a push sent just before a bunch
came back measured several times the link's rate (214 MB/s on a 25 MB/s link,
4 partitions acknowledged within 1.2 ms); the maximum kept those, the window
doubled within a launch and the 200 Mbit/s grid's steps got 10-20 % slower from
its first tries to its last (docs/results/byteps_ps_vs_allreduce_window.md).
Over two windows of bytes a bunch is averaged with the gaps around it. The
window is twice the best rate times the smallest round trip seen in the last
``HORIZON_S`` seconds (enough to keep the pipe full with one bandwidth-delay
product of slack), never below ``floor`` (one partition per server, at least
two) nor above ``cap``. With a short path the floor rules; with a long one the
window grows to the product.
"""
from __future__ import annotations

import time
from collections import deque

HORIZON_S = 10.0  # minima and maxima are kept over two half-horizons, so old samples age out
GAIN = 2.0
SPAN = 2.0  # a rate sample spans the acknowledgements of at least this many windows of bytes


class AutoWindow:
    def __init__(self, floor: int, cap: int, clock=time.perf_counter):
        self.floor, self.cap = int(floor), int(max(cap, floor))
        self.bytes = self.floor
        self._clock = clock
        self._start = clock()
        self._rtt = [float("inf"), float("inf")]  # min round trip: this half-horizon, the previous one
        self._rate = [0.0, 0.0]                   # max delivery rate (bytes/s), same halves
        self.delivered = 0                        # bytes acknowledged so far
        self._acks: deque = deque()               # (time, delivered) of the acknowledgements a rate spans

    def on_ack(self, nbytes: int, rtt_s: float) -> int:
        """One acknowledged push of ``nbytes``, ``rtt_s`` after it was sent. Returns the new window in bytes."""
        now = self._clock()
        self.delivered += int(nbytes)
        acks = self._acks
        acks.append((now, self.delivered))
        span = SPAN * self.bytes
        while len(acks) > 2 and self.delivered - acks[1][1] >= span:
            acks.popleft()
        if now - self._start > HORIZON_S / 2:
            self._start = now
            self._rtt = [float("inf"), self._rtt[0]]
            self._rate = [0.0, self._rate[0]]
        if rtt_s > 0:
            self._rtt[0] = min(self._rtt[0], rtt_s)
        t0, d0 = acks[0]
        if self.delivered - d0 >= span and now > t0:
            self._rate[0] = max(self._rate[0], (self.delivered - d0) / (now - t0))
        bdp = max(self._rate) * min(self._rtt)
        self.bytes = int(min(self.cap, max(self.floor, GAIN * bdp)))
        return self.bytes
