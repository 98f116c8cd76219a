"""The live timeline: what each worker did during steps START..END, as a Chrome
trace in ``<trace_dir>/<rank>/timeline.json`` (``PUSHPULL_TRACE_ON=1``).

Why a module-level object: the engine, the optimizer, the strategies and the
auto-tuner all add events to one per-process timeline, and when tracing is off
each of them pays exactly one attribute check (``trace.current is None`` in the
training code, ``Pipeline.tracer is None`` on the I/O thread, handed in by
``Engine.set_tracer``).

Steps are counted by the optimizer wrappers' ``step()`` (DistributedOptimizer, ScheduledOptimizer,
AsyncOptimizer: ``pushpull.torch.hooks.step_done``; one call = one step) or,
once a program calls :func:`step` (``pushpull.torch.trace_step()``) itself,
only by those explicit calls. Step 0 starts at ``init()``.

Tracks (one Chrome "thread" each):

* ``step``: one ``step N`` event per step (the summary's step boundaries).
* ``compute``: the training thread: ``forward/backward`` up to
  ``synchronize`` (waiting for the gradients, category ``wait``), then
  ``update``; without an optimizer, one ``compute`` span per step.
* ``wait``: each blocking ``synchronize(handle)`` and forward waits of the
  layer-wise optimizer (category ``wait``).
* one track per tensor (``push_pull`` from submit to output, category ``op``)
  and, for tensors of several partitions, one per partition ``name#i``; each
  partition has ``queue`` (submit -> admitted by the credit queue),
  ``compress``, ``push`` (sent -> PUSH_ACK), ``pull`` (-> PULL_RESP) and
  ``decompress``, in that order and never overlapping.

Categories drive ``pushpull timeline summarize``: ``compute`` minus ``wait`` is
computation, ``comm`` is communication.

The file is rewritten atomically at the end of the traced window, at exit and
on SIGTERM, so it is valid JSON whenever the job stops; inside the window at
most every ``FLUSH_EVERY_S`` seconds (a step's end), because a rewrite runs on
the training thread and costs time in proportion to everything recorded so far:
rewritten after every step, it lengthened the traced steps themselves
(docs/results/simulator.md, why ``partition_only``'s tries differ). A job
killed with SIGKILL loses at most the last ``FLUSH_EVERY_S`` seconds.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

from pushpull.timeline import TraceWriter

FLUSH_EVERY_S = 10.0  # inside the traced window, the file is rewritten at most this often

log = logging.getLogger(__name__)

#: the process's tracer when PUSHPULL_TRACE_ON=1 (counts steps even outside the window)
TRACER: "Tracer | None" = None
#: the same object while a traced step is running, else None: the one check hot paths make
current: "Tracer | None" = None


class Tracer:
    """Collects one worker's events for steps ``start_step``..``end_step``."""

    def __init__(self, path: str | Path | None, rank: int = 0, start_step: int = 0, end_step: int = 0,
                 engine=None, process_name: str | None = None):
        self.rank = rank
        self.first_step = start_step
        self.last_step = end_step
        self.engine = engine
        self.writer = TraceWriter(path, pid=rank, process_name=process_name or f"worker {rank}",
                                  metadata={"rank": rank, "start_step": start_step, "end_step": end_step})
        for t in ("step", "compute", "wait"):
            self.writer.track(t)  # fixed order at the top of the view
        self.step_index = 0
        self.on = False
        self.finished = False
        self.explicit = False
        self._step_t0 = time.perf_counter()
        self._syncs: list[tuple[float, float]] = []
        # partition key -> [round, t_submit, t_admit, t_sent, t_ack]; touched on the I/O thread only
        self._parts: dict[int, list] = {}
        self._resp: dict[int, float] = {}
        self._window_start = 0.0
        self._last_flush = time.perf_counter()
        if start_step == 0:
            self._set_on(True)

    # ------------------------------------------------------------ window --
    def _set_on(self, on: bool) -> None:
        global current
        self.on = on
        if on:
            self._parts.clear()
            self._resp.clear()
            self._window_start = time.perf_counter()
        if self.engine is not None:
            self.engine.set_tracer(self if on else None)
        if TRACER is self:
            current = self if on else None

    def end_step(self, explicit: bool = False) -> None:
        """The step now running has ended (called on the training thread).

        Calls from the optimizer are ignored once the program counts steps
        itself with :func:`step`, so a step is never counted twice; a first
        explicit call right after optimizer-counted steps closes no new step."""
        now = time.perf_counter()
        if explicit and not self.explicit:
            self.explicit = True
            if self.step_index > 0:
                # the optimizer has been counting and just ended this iteration's step:
                # this first explicit call ends the same step, so only re-base it
                self._step_t0 = now
                self._syncs = []
                return
        elif not explicit and self.explicit:
            return
        if self.on:
            self._emit_step(now)
            if now - self._last_flush >= FLUSH_EVERY_S:
                self.flush()
        self.step_index += 1
        self._step_t0 = now
        self._syncs = []
        if self.finished:
            return
        if self.step_index > self.last_step:
            self._set_on(False)
            self.finished = True
            self.flush()
            log.info("timeline of steps %d..%d written to %s", self.first_step, self.last_step, self.writer.path)
        elif self.step_index >= self.first_step and not self.on:
            self._set_on(True)

    def synchronized(self, t0: float) -> None:
        """The training thread waited for the gradients from ``t0`` until now."""
        if self.on:
            self._syncs.append((t0, time.perf_counter()))

    def _emit_step(self, t_end: float) -> None:
        w = self.writer
        s = self.step_index
        w.span("step", f"step {s}", self._step_t0, t_end, cat="step", args={"step": s})
        t = self._step_t0
        first = True
        for a, b in self._syncs:
            a = max(a, t)
            if a > t:
                w.span("compute", "forward/backward" if first else "compute", t, a, cat="compute",
                       args={"step": s})
            w.span("compute", "synchronize", a, b, cat="wait", args={"step": s})
            t, first = b, False
        if t_end > t:
            w.span("compute", "compute" if first else "update", t, t_end, cat="compute", args={"step": s})

    # ------------------------------------------------------------ generic API --
    @contextlib.contextmanager
    def span(self, track: str, name: str, cat: str = "compute", **args):
        """Time the ``with`` block as one event on ``track``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.on:
                self.writer.span(track, name, t0, time.perf_counter(), cat, args or None)

    def event(self, track: str, name: str, t0: float, t1: float | None = None, cat: str = "compute",
              **args) -> None:
        """An event from ``time.perf_counter()`` readings (``t1`` defaults to now)."""
        if self.on:
            self.writer.span(track, name, t0, time.perf_counter() if t1 is None else t1, cat, args or None)

    def mark(self, track: str, name: str, **args) -> None:
        """A zero-length marker, e.g. a setting changed by the auto-tuner."""
        if self.on:
            self.writer.instant(track, name, args=args or None)

    def flush(self) -> None:
        self._last_flush = time.perf_counter()
        try:
            self.writer.flush()
        except OSError as e:
            log.warning("could not write the timeline %s: %s", self.writer.path, e)

    # ------------------------------------------------------------ engine hooks (I/O thread) --
    def admitted(self, op, p) -> None:
        """The credit queue admitted partition ``p`` of ``op``."""
        self._parts[p.key] = [op.round, op.t_submit, time.perf_counter(), 0.0, 0.0]
        if len(op.entry.parts) > 1:  # tracks in admission order: name, name#0, name#1...
            self.writer.track(op.entry.name)
            self.writer.track(f"{op.entry.name}#{p.index}")

    def sent(self, p) -> None:
        rec = self._parts.get(p.key)
        if rec is not None:
            rec[3] = time.perf_counter()

    def push_acked(self, key: int, rnd: int) -> None:
        rec = self._parts.get(key)
        if rec is not None and rec[0] == rnd and not rec[4]:
            rec[4] = time.perf_counter()

    def pull_received(self, key: int) -> None:
        self._resp[key] = time.perf_counter()

    def partition_done(self, op, p) -> None:
        """The pulled sum of ``p`` is in the output: emit the partition's events."""
        rec = self._parts.pop(p.key, None)
        t_resp = self._resp.pop(p.key, None)
        if rec is None or t_resp is None or not rec[3] or rec[0] != op.round:
            return  # admitted before the traced window opened
        now = time.perf_counter()
        rnd, t_sub, t_admit, t_sent, t_ack = rec
        e = op.entry
        w = self.writer
        w.track(e.name)
        track = e.name if len(e.parts) == 1 else f"{e.name}#{p.index}"
        args = {"step": self.step_index, "round": rnd, "part": p.index, "key": p.key, "bytes": p.nbytes,
                "server": p.server, "priority": op.priority}
        compressed = getattr(p, "codec", None) is not None
        t_push_end = t_ack if t_ack and t_ack <= t_resp else t_resp
        w.span(track, "queue", t_sub, t_admit, "queue", args)
        if compressed:
            w.span(track, "compress", t_admit, t_sent, "codec", args)
        w.span(track, "push", t_sent, t_push_end, "comm", args)
        w.span(track, "pull", t_push_end, t_resp, "comm", args)
        if compressed:
            w.span(track, "decompress", t_resp, now, "codec", args)

    def op_done(self, op, error: str | None) -> None:
        """``op`` completed: one ``push_pull`` event on the tensor's track."""
        if op.t_submit < self._window_start:
            return  # submitted before the traced window opened
        args = {"step": self.step_index, "round": op.round, "parts": len(op.entry.parts),
                "priority": op.priority}
        if error:
            args["error"] = error
        self.writer.span(op.entry.name, "push_pull", op.t_submit, time.perf_counter(), "op", args)


# ---------------------------------------------------------------- process-wide --

def install(cfg, rank: int, engine=None) -> Tracer | None:
    """Create the process's tracer if ``cfg.trace_on`` (called by ``pushpull.torch.init``)."""
    global TRACER
    if not cfg.trace_on:
        return None
    if TRACER is not None:
        uninstall()
    path = Path(cfg.trace_dir) / str(rank) / "timeline.json"
    tr = Tracer(path, rank, cfg.trace_start_step, cfg.trace_end_step, engine=None)
    TRACER = tr
    tr.engine = engine
    tr._set_on(tr.on)  # publish ``current`` / the engine's tracer for a window that starts at step 0
    tr.flush()  # an (empty) valid file from the start
    _install_exit_hooks()
    log.info("tracing steps %d..%d to %s", cfg.trace_start_step, cfg.trace_end_step, path)
    return tr


def uninstall() -> None:
    """Write the timeline and stop tracing (``pushpull.torch.shutdown``)."""
    global TRACER, current
    tr = TRACER
    if tr is None:
        return
    if tr.engine is not None:
        tr.engine.set_tracer(None)
    TRACER = None
    current = None
    tr.flush()


def _flush_at_exit() -> None:
    if TRACER is not None:
        TRACER.flush()


_hooks_installed = False


def _install_exit_hooks() -> None:
    """Flush at exit and on SIGTERM (what the launcher sends when a job is torn
    down), then let the previous SIGTERM handler (or the default: exit) run."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_flush_at_exit)
    if threading.current_thread() is not threading.main_thread():
        return
    prev = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        tr = TRACER
        if tr is not None:
            tr.flush()
        if callable(prev):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def span(track: str, name: str, cat: str = "compute", **args):
    """``with trace.span("update", "update fc1.weight"):`` -- a no-op unless a traced step runs."""
    tr = current
    if tr is None:
        return contextlib.nullcontext()
    return tr.span(track, name, cat, **args)


def event(track: str, name: str, t0: float, t1: float | None = None, cat: str = "compute", **args) -> None:
    """Record an event from ``time.perf_counter()`` readings; a no-op when not tracing."""
    tr = current
    if tr is not None:
        tr.event(track, name, t0, t1, cat, **args)


def step() -> None:
    """Mark the end of a training step explicitly (``pushpull.torch.trace_step()``).

    Once called, the DistributedOptimizer no longer counts steps, so programs
    with several optimizers or none get the step boundaries they choose."""
    tr = TRACER
    if tr is not None:
        tr.end_step(explicit=True)
