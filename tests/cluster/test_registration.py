"""Misconfigured jobs end in seconds with a precise error (issue 15, item 6): BytePS-style roles started
without the launcher, as on several machines, on loopback."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pushpull.launch.cli import free_port

ROOT = Path(__file__).resolve().parents[2]
BPSLAUNCH = [sys.executable, "-c", "from pushpull.launch.cli import bpslaunch_main; bpslaunch_main()"]
WORKER = [sys.executable, str(ROOT / "tests" / "scripts" / "pp_worker.py"), "rounds"]


def _env(role: str, port: int, workers: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    env.update({"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": "1", "PUSHPULL_SECRET": f"reg {port}"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(procs: list[subprocess.Popen], timeout: float = 40) -> tuple[list[str], float]:
    t0 = time.monotonic()
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs, time.monotonic() - t0


def _popen(env: dict, cmd: list[str] = ()) -> subprocess.Popen:
    return subprocess.Popen(BPSLAUNCH + (["--", *cmd] if cmd else []), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def scenarios() -> dict:
    """The three misconfigurations started at once (each waits ~15 s for its registration timeout)."""
    started = {}
    port = free_port()
    started["missing"] = ([_popen(_env("scheduler", port, 3)), _popen(_env("server", port, 3))],
                          [_popen(_env("worker", port, 3, DMLC_WORKER_ID=i), WORKER) for i in (0, 1)])
    started["no scheduler"] = ([], [_popen(_env("worker", free_port(), 2, DMLC_WORKER_ID=0), WORKER)])
    port = free_port()
    infra = [_popen(_env("scheduler", port, 2)), _popen(_env("server", port, 2))]
    first = _popen(_env("worker", port, 2, DMLC_WORKER_ID=0), WORKER)
    time.sleep(1.0)
    started["duplicate"] = (infra, [first, _popen(_env("worker", port, 2, DMLC_WORKER_ID=0), WORKER)])
    t0 = time.monotonic()
    ended: dict[int, float] = {}  # pid -> seconds until it exited, all scenarios watched at once
    everyone = [p for _, workers in started.values() for p in workers]
    while len(ended) < len(everyone) and time.monotonic() - t0 < 40:
        for p in everyone:
            if p.pid not in ended and p.poll() is not None:
                ended[p.pid] = time.monotonic() - t0
        time.sleep(0.05)
    results = {}
    for name, (infra, workers) in started.items():
        outs, _ = _run(workers, 5)
        results[name] = (outs, max(ended.get(p.pid, 99.0) for p in workers))
        _run(infra, 10)
    return results


def test_missing_worker_is_named_within_20s_with_progress_on_the_way(scenarios):
    outs, took = scenarios["missing"]
    assert took < 20, took
    for out in outs:
        assert "registration timed out" in out and "missing rank(s) [2]" in out, out[-2000:]
        assert "2 of 3 workers registered" in out, out[-2000:]  # the progress line, before the error


def test_worker_without_scheduler_says_it_timed_out_within_20s(scenarios):
    """The node gives up PUSHPULL_REGISTER_TIMEOUT + 3 s after it began registering (its own clock, in the
    message); the wall-clock bound adds its start-up (Python and torch imports), which takes several seconds
    when the fixture starts nine processes at once on two cores."""
    outs, took = scenarios["no scheduler"]
    assert "registration timed out" in outs[0] and "no answer from the scheduler" in outs[0], outs[0][-2000:]
    waited = re.search(r"no answer from the scheduler at \S+ within (\d+)s", outs[0])
    assert waited and int(waited.group(1)) <= 19, outs[0][-2000:]
    assert took < 30, took


def test_duplicate_worker_id_fails_both_within_20s_naming_it(scenarios):
    outs, took = scenarios["duplicate"]
    assert took < 20, took
    assert "two workers claim rank 0" in outs[1], outs[1][-2000:]
    assert "registration timed out" in outs[0] and "two workers claim rank 0" in outs[0], outs[0][-2000:]
