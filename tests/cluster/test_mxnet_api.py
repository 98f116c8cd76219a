"""The MXNet binding over real processes (tests/scripts/mx_worker.py), run with the MXNet environment's
interpreter: collectives, Gluon's DistributedTrainer, gluon.Trainer over the "pushpull" KVStore and
ScheduledKVStore, DistributedOptimizer, each checked against single-process training on the concatenated
batch; the Gluon digits example both ways.

mxnet 1.9.1 needs NumPy < 1.24, so it lives in its own environment: PUSHPULL_MXNET_PYTHON, else
.venv-mxnet/bin/python (scripts/test-mxnet.sh --install-only makes it). Without one that imports
mxnet and pushpull.mxnet, these tests skip saying why.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "mx_worker.py")
EXAMPLE = str(ROOT / "examples" / "train_digits_gluon.py")
ENV = {"PUSHPULL_TIMEOUT": "30", "OMP_NUM_THREADS": "1"}


def _interpreter() -> tuple[str | None, str]:
    py = os.environ.get("PUSHPULL_MXNET_PYTHON") or str(ROOT / ".venv-mxnet" / "bin" / "python")
    if not Path(py).exists():
        return None, f"no MXNet environment at {py} (bash scripts/test-mxnet.sh --install-only makes one)"
    try:
        res = subprocess.run([py, "-c", "import mxnet, pushpull.mxnet"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"{py}: importing mxnet took over 120 s"
    if res.returncode != 0:
        return None, f"{py} cannot import mxnet / pushpull.mxnet: {res.stderr.strip().splitlines()[-1:]}"
    return py, ""


PY, WHY = _interpreter()
pytestmark = pytest.mark.skipif(PY is None, reason=WHY)


def launch(workers: int, servers: int, cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    argv = [PY, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in ENV.items():
        argv += ["--env", f"{k}={v}"]
    return subprocess.run(argv + ["--", *cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def assert_ok(res: subprocess.CompletedProcess, workers: int, cases: tuple[str, ...]) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "FAIL" not in out, out[-5000:]
    assert out.count("ALL-OK") == workers, out[-5000:]
    for case in cases:
        assert out.count(f"case {case} ok") == workers, out[-3000:]
    return out


ALL = ("collectives", "trainer", "kvstore", "optimizer", "order")


def test_mxnet_api_under_launcher():
    """Two workers, one server: every case, the equivalence ones against one process with batch 2b."""
    assert_ok(launch(2, 1, [PY, WORKER, "all"]), 2, ALL)


def test_mxnet_api_single_process_mode():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update(ENV)
    res = subprocess.run([PY, WORKER, "all"], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert_ok(res, 1, ALL)


@pytest.mark.parametrize("kvstore", [False, True], ids=["DistributedTrainer", "kvstore"])
def test_gluon_example_reaches_accuracy_with_two_workers(kvstore):
    res = launch(2, 1, [PY, EXAMPLE, "--min-accuracy", "0.95", "--json"] + (["--kvstore"] if kvstore else []))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines() if "{" in ln and "test_accuracy" in ln]
    assert lines, out[-3000:]
    s = json.loads(lines[-1])
    assert s["workers"] == 2 and s["test_accuracy"] >= 0.95 and s["kvstore"] == kvstore, s
