"""Live metrics for Prometheus (PUSHPULL_METRICS_PORT; the ``[metrics]`` extra, prometheus_client).

Why a collector read at scrape time, not counters updated on the data path: the engine and the server keep
their own figures already (bytes, partitions, rounds, queues), so a scrape reads them when Prometheus asks
and the data path pays nothing. Step times come from the optimizer wrappers' ``step()``
(:func:`step_done`). Where they listen: PUSHPULL_METRICS_HOST, loopback by default (docs/metrics.md).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from pushpull.transport.security import is_loopback

log = logging.getLogger(__name__)

SERVER_PORT_OFFSET = 500  # server k listens on PUSHPULL_METRICS_PORT + 500 + k; worker r on + r

# (name, kind, help, value[, labels]): what a role's collect function returns; kind is "gauge" or "counter";
# labels (optional, e.g. {"rank": "2"}): several samples of one name differ by them
Sample = tuple


class _Steps:
    """The training thread's steps, as the optimizer wrappers report them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0
        self.last_end: float | None = None
        self.last_s = 0.0
        self.total_s = 0.0
        self.listeners: list[Callable[[int, float], None]] = []  # fn(step, seconds) after each step

    def done(self) -> None:
        now = time.perf_counter()
        with self.lock:
            if self.last_end is not None:
                self.last_s = now - self.last_end
                self.total_s += self.last_s
            self.count += 1
            self.last_end = now
            step, seconds, listeners = self.count, self.last_s, list(self.listeners)
        for fn in listeners:
            fn(step, seconds)

    def samples(self) -> list[Sample]:
        with self.lock:
            return [("pushpull_steps_total", "counter", "training steps taken (optimizer step() calls)", self.count),
                    ("pushpull_step_seconds", "gauge", "wall time of the last training step", self.last_s),
                    ("pushpull_step_time_seconds_total", "counter", "wall time of every step but the first",
                     self.total_s)]


STEPS = _Steps()


def step_done() -> None:
    """A training step ended (called by every optimizer wrapper's step())."""
    STEPS.done()


def start(role: str, port: int, host: str, collect: Callable[[], list[Sample]], labels: dict) -> object | None:
    """Serve ``collect()``'s samples, labelled with ``labels`` (role, rank), on http://host:port/metrics; None
    (and a warning naming the fix) without prometheus_client or when the port is taken."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError:
        log.warning("PUSHPULL_METRICS_PORT=%d but prometheus_client is not installed: pip install "
                    "'pushpull[metrics]'; no metrics from this %s", port, role)
        return None
    names = sorted(labels)

    class Collector:
        def collect(self):
            families: dict = {}
            for name, kind, text, value, *more in collect():
                own = more[0] if more else {}
                fam = families.get(name)
                if fam is None:
                    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                    fam = families[name] = cls(name.removesuffix("_total") if kind == "counter" else name, text,
                                               labels=names + sorted(own))
                fam.add_metric([str(labels[k]) for k in names] + [str(own[k]) for k in sorted(own)], float(value))
            yield from families.values()

    registry = CollectorRegistry()
    registry.register(Collector())
    try:
        server = start_http_server(port, addr=host, registry=registry)
    except (OSError, OverflowError, ValueError) as e:  # taken, or out of range (PORT + rank > 65535)
        log.warning("no metrics endpoint for this %s: %s:%d: %s", role, host, port, e)
        return None
    if not is_loopback(host):
        log.warning("PUSHPULL_METRICS_HOST=%s: this %s's metrics (read-only: no tensors, no secret) can be read "
                    "by anyone who reaches %s:%d, without authentication", host, role, host, port)
    log.info("%s metrics on http://%s:%d/metrics", role, host, port)
    return server


def stop(handle) -> None:
    """Close an endpoint :func:`start` returned (prometheus_client >= 0.17 returns (server, thread))."""
    if isinstance(handle, tuple) and handle and hasattr(handle[0], "shutdown"):
        handle[0].shutdown()
        handle[0].server_close()


class TensorBoard:
    """PUSHPULL_TENSORBOARD_DIR: a worker's scalars per optimizer step (torch.utils.tensorboard's writer, which
    needs the tensorboard package): step time, MB/s pushed and pulled over the step, communication, waiting
    and overlap time, the compression ratio, the job's size and generation. Written on the training thread at the end of each step; flushed every 10 s by the writer."""

    def __init__(self, logdir: str, stats: Callable[[], dict]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(logdir)
        self.stats = stats
        self.before = stats()

    def step(self, step: int, seconds: float) -> None:
        now = self.stats()
        if seconds > 0:
            w = self.writer
            w.add_scalar("pushpull/step_seconds", seconds, step)
            w.add_scalar("pushpull/push_MBps", (now["bytes_pushed"] - self.before["bytes_pushed"]) / seconds / 1e6, step)
            w.add_scalar("pushpull/pull_MBps", (now["bytes_pulled"] - self.before["bytes_pulled"]) / seconds / 1e6, step)
            w.add_scalar("pushpull/workers", now["workers"], step)
            w.add_scalar("pushpull/generation", now["generation"], step)
            comm, wait = (sum(now[k] - self.before[k] for k in ks) for ks in (("comm_s", "direct_s"), ("wait_s", "direct_s")))
            w.add_scalar("pushpull/comm_seconds", comm, step)  # this step's time with a reduction in flight,
            w.add_scalar("pushpull/wait_seconds", wait, step)  # the part the training thread waited for,
            w.add_scalar("pushpull/overlap_seconds", max(0.0, comm - wait), step)  # the part computation hid
            pushed = now["bytes_pushed"] - self.before["bytes_pushed"]
            if pushed:
                w.add_scalar("pushpull/compression_ratio", (now["bytes_pushed_raw"] - self.before["bytes_pushed_raw"])
                             / pushed, step)
        self.before = now

    def close(self) -> None:
        self.writer.close()


def start_tensorboard(logdir: str, stats: Callable[[], dict]) -> TensorBoard | None:
    """A TensorBoard writer fed by every step (None, and a warning naming the fix, without tensorboard)."""
    try:
        tb = TensorBoard(logdir, stats)
    except ImportError as e:
        log.warning("PUSHPULL_TENSORBOARD_DIR=%s but %s: pip install 'pushpull[metrics]'", logdir, e)
        return None
    STEPS.listeners.append(tb.step)
    return tb


def stop_tensorboard(tb: TensorBoard | None) -> None:
    if tb is not None:
        if tb.step in STEPS.listeners:
            STEPS.listeners.remove(tb.step)
        tb.close()
