"""Live metrics (PUSHPULL_METRICS_PORT): every worker and server of a real job serves Prometheus's text
format on loopback; the figures move with the training (docs/metrics.md)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pushpull.launch.cli import free_port

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("prometheus_client", reason="the [metrics] extra (prometheus_client) is not installed")


@pytest.fixture(scope="module")
def tensorboard_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tensorboard")


@pytest.fixture(scope="module")
def figures(tensorboard_dir) -> dict:
    port = free_port()
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1",
            "--env", f"PUSHPULL_METRICS_PORT={port}", "--env", f"PUSHPULL_TENSORBOARD_DIR={tensorboard_dir}",
            "--env", "TF_CPP_MIN_LOG_LEVEL=3", "--", sys.executable,
            str(ROOT / "tests" / "scripts" / "metrics_worker.py")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and out.count("ALL-OK") == 2, out[-3000:]
    got: dict = {}
    for rank, who, name, value in re.findall(r"METRIC (\d) (\w+) (\w+) (\S+)", out):
        got[(int(rank), who, name)] = float(value)
    got["openmetrics"] = re.findall(r"OPENMETRICS (\d) (\w+) (\d+) families", out)
    top = re.search(r"TOP-BEGIN\n(.*?)TOP-END", out, re.S)
    got["top"] = re.sub(r"(?m)^\[worker \d\] ?", "", top.group(1)) if top else out[-3000:]
    return got


@pytest.mark.parametrize("rank", [0, 1])
def test_each_worker_counts_its_steps_and_bytes(figures, rank):
    assert figures[(rank, "worker", "pushpull_steps_total")] >= 6
    assert figures[(rank, "worker", "pushpull_bytes_pushed_total")] > 0
    assert figures[(rank, "worker", "pushpull_bytes_pulled_total")] > 0
    assert figures[(rank, "worker", "pushpull_step_seconds")] > 0


@pytest.mark.parametrize("rank", [0, 1])
def test_each_worker_reports_the_job(figures, rank):
    assert figures[(rank, "worker", "pushpull_workers")] == 2
    assert figures[(rank, "worker", "pushpull_rank")] == rank
    assert figures[(rank, "worker", "pushpull_generation")] == 0


def test_the_server_reports_its_keys_and_rounds(figures):
    assert figures[(0, "server", "pushpull_server_keys")] >= 2  # weight and bias
    assert figures[(0, "server", "pushpull_server_rounds")] >= 2 * 6
    assert figures[(0, "server", "pushpull_workers")] == 2
    assert (0, "server", "pushpull_server_queue_depth") in figures


def test_pushpull_top_shows_every_worker_and_server_live(figures):
    """`pushpull top --once` run by rank 0 while both workers train about 10 steps per second."""
    lines = figures["top"].splitlines()
    workers = [ln.split() for ln in lines if re.match(r"^[01]\s+[01]\s", ln)]
    assert len(workers) == 2, figures["top"]
    assert all(float(w[2]) > 1.0 for w in workers), figures["top"]  # steps/s
    assert any(re.match(r"^server\s+keys", ln) for ln in lines) and any(re.match(r"^0\s+\d+\s+[\d.]+\s+\d+", ln)
                                                                       for ln in lines[lines.index(""):]), figures["top"]


def test_prometheus_parses_every_endpoint_in_openmetrics(figures):
    """What Prometheus asks for by default; a name served as two families (a gauge and a counter) fails it."""
    assert sorted((r, w) for r, w, _ in figures["openmetrics"]) == [("0", "server"), ("0", "worker"), ("1", "server"),
                                                                   ("1", "worker")]


def _tensorboard(tensorboard_dir, rank: int):
    """Worker ``rank``'s scalars, read back with TensorBoard's own reader."""
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                 reason="tensorboard is not installed")
    acc = ea_mod.EventAccumulator(str(tensorboard_dir / f"worker{rank}"))
    acc.Reload()
    return acc


@pytest.mark.parametrize("rank", [0, 1])
def test_each_worker_writes_tensorboard_scalars_per_step(figures, tensorboard_dir, rank):
    """PUSHPULL_TENSORBOARD_DIR: read back with TensorBoard's own reader (36 steps: 6 + 30)."""
    acc = _tensorboard(tensorboard_dir, rank)
    tags = set(acc.Tags()["scalars"])
    assert {"pushpull/step_seconds", "pushpull/push_MBps", "pushpull/pull_MBps", "pushpull/workers"} <= tags, tags
    steps = acc.Scalars("pushpull/step_seconds")
    assert len(steps) == 35 and all(e.value > 0 for e in steps)  # every step but the first (no duration yet)
    assert all(e.value == 2 for e in acc.Scalars("pushpull/workers"))
    assert sum(e.value for e in acc.Scalars("pushpull/push_MBps")) > 0


@pytest.mark.parametrize("rank", [0, 1])
def test_each_worker_splits_its_communication_into_waiting_and_overlap(figures, rank):
    comm = figures[(rank, "worker", "pushpull_comm_seconds_total")]
    wait = figures[(rank, "worker", "pushpull_wait_seconds_total")]
    overlap = figures[(rank, "worker", "pushpull_overlap_seconds_total")]
    assert comm > 0 and wait >= 0, (comm, wait)
    assert overlap == pytest.approx(max(0.0, comm - wait), abs=1e-3)
    assert figures[(rank, "worker", "pushpull_compression_ratio")] == 1.0  # no compression in this job


def test_the_server_reports_its_round_latency(figures):
    rounds = figures[(0, "server", "pushpull_server_rounds_timed_total")]
    total = figures[(0, "server", "pushpull_server_round_seconds_total")]
    assert rounds >= 2 * 6 and 0 < total / rounds < 5, (rounds, total)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_worker_writes_its_overlap_to_tensorboard(figures, tensorboard_dir, rank):
    acc = _tensorboard(tensorboard_dir, rank)
    comm = acc.Scalars("pushpull/comm_seconds")
    wait = acc.Scalars("pushpull/wait_seconds")
    overlap = acc.Scalars("pushpull/overlap_seconds")
    assert len(comm) == len(wait) == len(overlap) == 35
    assert sum(e.value for e in comm) > 0 and all(e.value >= 0 for e in overlap)
    assert {e.value for e in acc.Scalars("pushpull/compression_ratio")} == {1.0}
