"""The server's side of the timeline (``PUSHPULL_TRACE_ON=1`` on a server).

Why: a worker's timeline shows when its pull came back, not why it came late.
The server's shows, per key, when each worker's push arrived and when the
round completed (and so when its pulls were answered): a round that waits for
one slow push, or keys of one server completing in a burst, are visible only
here. Written to ``<trace_dir>/server<rank>/timeline.json`` (Chrome pid = node id) in the workers'
Chrome-trace format (``otherData.t0_unix_us`` lines the files up, since the
hosts of one machine or of an NTP-synchronised cluster share a clock).

Rounds ``trace_start_step .. trace_end_step + 1`` are recorded (a tensor's
round r is usually step r - 1: round 1 is its first push_pull); at most
``MAX_EVENTS`` events, so a long window cannot grow without bound.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from pushpull.cluster import nodes
from pushpull.cluster.assign import part_index
from pushpull.timeline import TraceWriter

log = logging.getLogger(__name__)

MAX_EVENTS = 200_000


class ServerTrace:
    def __init__(self, trace_dir: str, node_id: int, first_round: int, last_round: int):
        name = nodes.describe(node_id)  # "server 0"
        self.path = Path(trace_dir) / name.replace(" ", "") / "timeline.json"
        self.writer = TraceWriter(self.path, pid=node_id, process_name=name,
                                  metadata={"node_id": node_id, "first_round": first_round,
                                            "last_round": last_round})
        self.first_round, self.last_round = first_round, last_round
        self.events = 0
        self._first: dict[tuple[int, int], float] = {}  # (key, round) -> first push's arrival

    def push(self, name: str, key: int, rnd: int, rank: int, t_arrival: float, completed: bool) -> None:
        """One push of ``key`` arrived at ``t_arrival`` (perf_counter); ``completed`` if it ended the round."""
        if not self.first_round <= rnd <= self.last_round or self.events >= MAX_EVENTS:
            return
        track = f"{name}#{part_index(key)}"
        w = self.writer
        w.instant(track, f"push rank {rank}", ts_us=w.us(t_arrival), cat="push",
                  args={"key": key, "round": rnd, "rank": rank})
        first = self._first.setdefault((key, rnd), t_arrival)
        self.events += 1
        if completed:
            del self._first[(key, rnd)]
            w.span(track, f"round {rnd}", first, time.perf_counter(), cat="round",
                   args={"key": key, "round": rnd, "last_rank": rank})
            self.events += 1

    def flush(self) -> None:
        try:
            self.writer.flush()
            log.info("server timeline written to %s", self.path)
        except OSError as e:
            log.warning("could not write the server timeline %s: %s", self.path, e)
