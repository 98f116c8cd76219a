"""Network models: a fluid parameter-server network and a sequential ring.

Parameter server (fluid, max-min fair share). Every worker keeps one
connection to every server in each direction; messages on one connection are
sent in order (FIFO, like one TCP stream), while the head messages of all
connections share the NICs max-min fairly (TCP's long-run behaviour). All
workers run the same program, so the simulator follows one *representative*
worker and the n copies of each message are accounted as multiplicities on
the links: a push to server s is one flow on the worker's egress and n
flows on server s's ingress; its pull answer is n flows on server s's egress
and one on the worker's ingress. With ``colocated`` (BytePS' recommended
layout) server s shares machine s's NIC with worker s, so a push also
crosses the egress of every other machine that holds a server and the
traffic of the local worker never touches the NIC.

The n copies of a message advance at one rate (the slowest member's), which
is exact when workers are identical and an approximation in colocated mode,
where machines' egress loads differ slightly.

Ring all-reduce: collectives run one at a time, in the order they were
admitted (every rank issues them in the same order); each takes
``2(n-1) * (alpha + payload/(n*B))``.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Callable, Hashable

INF = math.inf


def max_min_rates(flows: dict[Hashable, list[tuple[Hashable, float]]],
                  capacity: dict[Hashable, float]) -> dict[Hashable, float]:
    """Max-min fair rates (progressive filling) for flows with multiplicities.

    ``flows[f]`` lists (link, m): flow class f puts m identical flows on the
    link. Every flow of a class gets the same rate. A class that uses no link
    (purely local traffic) gets an infinite rate.
    """
    rate: dict[Hashable, float] = {}
    residual: dict[Hashable, float] = {}
    unfrozen = []
    for f, links in flows.items():
        if not links:
            rate[f] = INF
        else:
            unfrozen.append(f)
            for l, _ in links:
                residual[l] = capacity[l]
    while unfrozen:
        load: dict[Hashable, float] = {}
        for f in unfrozen:
            for l, m in flows[f]:
                load[l] = load.get(l, 0.0) + m
        level = {l: (residual[l] / m if m > 0 else INF) for l, m in load.items()}
        r = min(level.values())
        if math.isinf(r):
            for f in unfrozen:
                rate[f] = INF
            break
        r = max(r, 0.0)
        cut = r * (1 + 1e-12) + 1e-300
        saturated = {l for l, v in level.items() if v <= cut}
        keep = []
        for f in unfrozen:
            links = flows[f]
            if any(l in saturated for l, _ in links):
                rate[f] = r
                for l, m in links:
                    residual[l] -= m * r
            else:
                keep.append(f)
        unfrozen = keep
    return rate


class Message:
    """One piece of a task travelling on one connection."""
    __slots__ = ("remaining", "size", "on_done", "started", "tag", "eps")

    def __init__(self, size: float, on_done: Callable[[float], None], tag=None):
        self.size = float(size)
        self.remaining = float(size)
        self.eps = 1e-9 * max(self.size, 1.0) + 1e-6   # bytes; absorbs float rounding
        self.on_done = on_done
        self.started = None
        self.tag = tag


class PSNetwork:
    """Fluid PS network: FIFO per connection, max-min fair across connections.

    Connections are keyed ("push", s) and ("pull", s); the event simulation
    (:mod:`pushpull.sim.events`) calls :meth:`send`, asks :meth:`next_time`
    for the next completion and calls :meth:`advance_to` to move time (which
    fires ``on_done(t)``).
    """

    def __init__(self, workers: int, servers: int, bandwidth: float, server_bandwidth: float,
                 colocated: bool = False, cpu=None):
        self.n, self.k = workers, servers
        self.now = 0.0
        self.queues: dict[tuple[str, int], deque[Message]] = {}
        self._rates: dict[tuple[str, int], float] = {}
        self._dirty = False
        self._next = INF
        self.capacity: dict[Hashable, float] = {}
        self.paths: dict[tuple[str, int], list[tuple[Hashable, float]]] = {}
        n, k = workers, servers
        self.colocated = colocated
        self.B, self.Bs = bandwidth, server_bandwidth
        if not colocated:
            self.capacity.update({"WE": bandwidth, "WI": bandwidth})
            for s in range(k):
                self.capacity[("SI", s)] = server_bandwidth
                self.capacity[("SE", s)] = server_bandwidth
                self.paths[("push", s)] = [("WE", 1), (("SI", s), n)]
                self.paths[("pull", s)] = [(("SE", s), n), ("WI", 1)]
        else:
            # machines 0..k-1 hold a worker and a server; k..n-1 hold a worker only
            for m in range(k):
                self.capacity[("E", m)] = bandwidth
                self.capacity[("I", m)] = bandwidth
            if n > k:
                self.capacity["WE"] = bandwidth
                self.capacity["WI"] = bandwidth
            for s in range(k):
                push = [(("E", m), 1) for m in range(k) if m != s]
                pull = [(("I", m), 1) for m in range(k) if m != s]
                if n > k:
                    push.append(("WE", 1))
                    pull.append(("WI", 1))
                if n > 1:
                    push.append((("I", s), n - 1))
                    pull.append((("E", s), n - 1))
                self.paths[("push", s)] = push
                self.paths[("pull", s)] = pull
        self.cpu = cpu
        if cpu is not None:
            self._add_cpu(cpu)
        for key in self.paths:
            self.queues[key] = deque()

    def _add_cpu(self, cpu) -> None:
        """Each process's CPU as one more link on its flows' paths (:class:`pushpull.sim.config.CpuCosts`).

        Why a link: the network is a fluid of max-min fair flows, and a process's CPU is shared by every
        byte it moves the same way a NIC is, except that one CPU serves both directions (a NIC is
        full-duplex). A CPU link's capacity is CPU-seconds per second (cores) and a flow class uses it
        with weight = CPU-seconds per byte x the copies of the flow on that process, so a flow's rate is
        capped by ``cores / (s per byte)`` and, where several flows need one CPU, they share it; whichever
        of the wire and the CPU is tighter sets the rate, i.e. a message takes max(wire time, CPU time)
        when it is alone. A serial CPU queue beside the NIC queue would instead make each message pay
        both in turn, which the CPU does not do: the I/O thread copies while the NIC sends.

        The representative worker's CPU is ``"WCPU"`` (its copies on the n machines are identical), server
        s's is ``("SCPU", s)``, each of ``cpu.cores``; with ``cpu.shared_cores`` every process also draws
        on one ``"POOL"`` (n workers' and the servers' shares of every flow) of that many cores."""
        n, k = self.n, self.k
        self.capacity["WCPU"] = cpu.cores
        for s in range(k):
            self.capacity[("SCPU", s)] = cpu.cores
        if cpu.shared_cores is not None:
            self.capacity["POOL"] = cpu.shared_cores
        for s in range(k):
            for kind, w, srv in (("push", cpu.worker_push, cpu.server_push),
                                 ("pull", cpu.worker_pull, cpu.server_pull)):
                path = self.paths[(kind, s)]
                if w > 0:
                    path.append(("WCPU", w))
                if srv > 0:
                    path.append((("SCPU", s), n * srv))
                if cpu.shared_cores is not None and (w > 0 or srv > 0):
                    path.append(("POOL", n * (w + srv)))

    # -- event simulation interface ------------------------------------------
    def send(self, conn: tuple[str, int], msg: Message) -> None:
        q = self.queues[conn]
        q.append(msg)
        if len(q) == 1:
            msg.started = self.now
            self._dirty = True

    def busy(self) -> bool:
        return any(self.queues.values())

    def _recompute(self) -> None:
        active = [c for c, q in self.queues.items() if q]
        if not self.colocated and self.cpu is None:
            # star: every push head shares the worker egress and is alone (x n workers)
            # on its server's ingress; all servers alike -> max-min is one min()
            n_push = sum(1 for c in active if c[0] == "push")
            n_pull = len(active) - n_push
            cap = self.Bs / self.n
            r_push = min(cap, self.B / n_push) if n_push else 0.0
            r_pull = min(cap, self.B / n_pull) if n_pull else 0.0
            self._rates = {c: (r_push if c[0] == "push" else r_pull) for c in active}
        else:
            self._rates = max_min_rates({c: self.paths[c] for c in active}, self.capacity) if active else {}
        self._dirty = False

    def next_time(self) -> float:
        """Absolute time of the next message completion (cached until rates change)."""
        if self._dirty:
            self._recompute()
            best = INF
            for c, r in self._rates.items():
                if r == INF:
                    best = self.now
                    break
                if r > 0:
                    t = self.now + self.queues[c][0].remaining / r
                    if t < best:
                        best = t
            self._next = best
        return self._next

    def advance_to(self, t: float) -> None:
        """Move the fluid to time ``t`` (<= next_time()) and fire completions."""
        nxt = self.next_time()
        dt = t - self.now
        self.now = t
        if dt > 0:
            for c, r in self._rates.items():
                head = self.queues[c][0]
                head.remaining -= r * dt
        if t < nxt:
            return
        done: list[tuple[tuple[str, int], Message]] = []
        for c, r in self._rates.items():
            head = self.queues[c][0]
            if r == INF or head.remaining <= head.eps:
                done.append((c, head))
        if not done:  # pragma: no cover - rounding left every head a hair short
            self._dirty = True
            return
        for c, msg in done:
            q = self.queues[c]
            q.popleft()
            if q:
                q[0].started = t
        self._dirty = True
        for c, msg in done:
            msg.on_done(t)


class Ring:
    """Sequential ring all-reduce: one collective at a time, admission order."""

    def __init__(self, workers: int, bandwidth: float, latency: float, cpu=None):
        self.n, self.B, self.alpha = workers, bandwidth, latency
        self.cpu = cpu
        self.free_at = 0.0

    def duration(self, payload: float) -> float:
        """``2(n-1) latency + max(wire, CPU)``: the ring's 2(n-1) steps each move ``payload/n`` over every
        link at once, and each rank's CPU sends, receives and sums its share while its NIC sends, so
        whichever is slower bounds the transfer (:class:`pushpull.sim.config.CpuCosts`)."""
        n = self.n
        if n == 1:
            return 0.0
        per_step = payload / n / self.B if not math.isinf(self.B) else 0.0
        wire = 2 * (n - 1) * per_step
        if self.cpu is not None:
            wire = max(wire, self.cpu.ring_cpu_s(n, payload) / self.cpu.rank_cores(n))
        return 2 * (n - 1) * self.alpha + wire

    def reserve(self, t: float, payload: float) -> tuple[float, float]:
        start = max(t, self.free_at)
        self.free_at = start + self.duration(payload)
        return start, self.free_at
