"""The Horovod/BytePS-shaped PyTorch API over real processes: broadcasts,
DistributedOptimizer semantics, the DDP wrapper and comm hook, equivalence with
single-process training, and the digits example, all under the real launcher.

Several cases share one launch (tests/scripts/api_worker.py) to keep this file
around a minute and a half on a small machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_cases import assert_case, shape_runner

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "api_worker.py")
EXAMPLE = str(ROOT / "examples" / "train_digits.py")
# a worker that hangs should fail the test quickly with pushpull's message, not the pytest timeout
ENV = {"PUSHPULL_TIMEOUT": "30", "OMP_NUM_THREADS": "1", "BYTEPS_PARTITION_BYTES": "200000"}


def launch(workers: int, servers: int, cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in ENV.items():
        argv += ["--env", f"{k}={v}"]
    return subprocess.run(argv + ["--", *cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def alone(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update(OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def assert_ok(res: subprocess.CompletedProcess, workers: int) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "FAIL" not in out, out[-5000:]
    assert out.count("ALL-OK") == workers, out[-5000:]
    return out


CASES = ["broadcast", "optstate", "grads", "equiv", "ddp", "ddp_hook", "scaler", "guards", "unused"]
SHAPES = {"2w-1s": (2, 1), "3w-2s": (3, 2), "alone": (1, 0)}  # alone: size()==1 without servers, all local


@pytest.fixture(scope="module")
def shape_runs():
    """One launch per shape, shared by its cases (each case is its own reported test)."""
    def launch_shape(shape: str):
        workers, servers = SHAPES[shape]
        return workers, (alone([sys.executable, WORKER, "all"]) if servers == 0
                         else launch(workers, servers, [sys.executable, WORKER, "all"]))
    return shape_runner(launch_shape)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_api_case(shape_runs, shape, case):
    workers, out = shape_runs(shape)
    assert_case(out, case, workers)


def test_every_case_is_tested():
    import re

    names = re.findall(r'"(\w+)": case_\w+', Path(WORKER).read_text())
    assert names == CASES


def _summary(out: str) -> dict:
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines() if "{" in ln and "test_accuracy" in ln]
    assert lines, out[-3000:]
    return json.loads(lines[-1])


def test_example_reaches_accuracy_with_two_workers():
    res = launch(2, 1, [sys.executable, EXAMPLE, "--min-accuracy", "0.95", "--json", "--no-progress"])
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    s = _summary(out)
    assert s["workers"] == 2 and s["test_accuracy"] >= 0.95 and s["bytes_pushed"] > 0, s
    assert "final: test_accuracy=" in out


def test_example_alone_and_min_accuracy_failure():
    """Runs as a plain script; an unreachable --min-accuracy exits non-zero."""
    res = alone([sys.executable, EXAMPLE, "--epochs", "1", "--min-accuracy", "0.999", "--json", "--no-progress"])
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "below --min-accuracy" in out
    s = _summary(out)
    assert s["workers"] == 1 and s["epochs"] == 1 and s["bytes_pushed"] == 0
