"""Chrome-trace (Perfetto / chrome://tracing) writer shared by the live
timeline and the simulator, so a simulated and a measured iteration can be
opened side by side.

Events are complete events (``ph: "X"``) with microsecond timestamps. ``pid``
is the worker rank, ``tid`` a small integer per track (one track per tensor,
plus tracks such as "compute"); ``thread_name`` metadata events give tracks
their names. The file is rewritten atomically on every flush so it is valid
JSON even if the job is interrupted.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


class TraceWriter:
    """Collects events in memory and writes a JSON array atomically."""

    def __init__(self, path: str | Path | None, pid: int = 0, process_name: str | None = None,
                 metadata: dict | None = None):
        self.path = Path(path) if path else None
        self.pid = pid
        # re-entrant: a SIGTERM handler may flush while the same thread is inside flush()
        self._lock = threading.RLock()
        self._events: list[dict] = []
        self._tracks: dict[str, int] = {}
        self._t0 = time.perf_counter()
        # wall-clock time of ts=0, so traces of several processes can be aligned (``merge``)
        self.metadata = {"t0_unix_us": round(time.time() * 1e6), **(metadata or {})}
        if process_name:
            self._events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                 "args": {"name": process_name}})

    def now_us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    def us(self, perf_t: float) -> float:
        """Trace time (µs) of a ``time.perf_counter()`` reading."""
        return (perf_t - self._t0) * 1e6

    def track(self, name: str) -> int:
        with self._lock:
            tid = self._tracks.get(name)
            if tid is None:
                tid = len(self._tracks) + 1
                self._tracks[name] = tid
                self._events.append({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid,
                                     "args": {"name": name}})
                self._events.append({"name": "thread_sort_index", "ph": "M", "pid": self.pid, "tid": tid,
                                     "args": {"sort_index": tid}})
            return tid

    def complete(self, track: str, name: str, ts_us: float, dur_us: float, cat: str = "comm",
                 args: dict | None = None) -> None:
        """Record a complete event on ``track`` starting at ``ts_us`` lasting ``dur_us``."""
        tid = self.track(track)
        ev = {"name": name, "cat": cat, "ph": "X", "pid": self.pid, "tid": tid,
              "ts": round(ts_us, 3), "dur": round(max(dur_us, 0.0), 3)}
        if args:
            ev["args"] = args
        with self._lock:
            self._events.append(ev)

    def span(self, track: str, name: str, t0: float, t1: float, cat: str = "comm",
             args: dict | None = None) -> None:
        """Like :meth:`complete`, from two ``time.perf_counter()`` readings (seconds)."""
        self.complete(track, name, (t0 - self._t0) * 1e6, (t1 - t0) * 1e6, cat, args)

    def instant(self, track: str, name: str, ts_us: float | None = None, cat: str = "mark",
                args: dict | None = None) -> None:
        """A zero-length marker (``ph: "i"``), e.g. a setting changed by the auto-tuner."""
        tid = self.track(track)
        ev = {"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.pid, "tid": tid,
              "ts": round(self.now_us() if ts_us is None else ts_us, 3)}
        if args:
            ev["args"] = args
        with self._lock:
            self._events.append(ev)

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def flush(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + f".tmp{os.getpid()}")
        data = self.events()
        tmp.write_text(json.dumps({"traceEvents": data, "displayTimeUnit": "ms", "otherData": self.metadata}))
        os.replace(tmp, self.path)


def load_trace(path: str | Path) -> tuple[list[dict], dict]:
    """Events and ``otherData`` metadata of a trace file (metadata is {} for bare arrays)."""
    d = json.loads(Path(path).read_text())
    if isinstance(d, dict):
        return d["traceEvents"], dict(d.get("otherData") or {})
    return d, {}


def load_events(path: str | Path) -> list[dict]:
    """Read a trace written by :class:`TraceWriter` (object or bare-array form)."""
    d = json.loads(Path(path).read_text())
    return d["traceEvents"] if isinstance(d, dict) else d
