"""The TensorFlow and Keras 3 bindings over real processes (tests/scripts/tf_worker.py): collectives,
DistributedGradientTape (eager and tf.function), Keras fit with DistributedOptimizer and the callbacks,
a TF1 graph with DistributedOptimizer, each checked against single-process training on the
concatenated batch; the Keras digits example. Skipped when TensorFlow is not installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="tensorflow-cpu is not installed (scripts/install.sh installs it)")

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "tf_worker.py")
EXAMPLE = str(ROOT / "examples" / "train_digits_keras.py")
# importing TensorFlow took over the 15 s registration default once on the loaded 2-core VM (no worker
# registered): the workers get the time the Lightning, Hugging Face and no-torch tests give theirs
ENV = {"PUSHPULL_TIMEOUT": "30", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PUSHPULL_REGISTER_TIMEOUT": "90"}


def launch(workers: int, servers: int, cmd: list[str], env: dict | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in {**ENV, **(env or {})}.items():
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


ALL = ("collectives", "tape", "order", "keras", "warmup", "v1", "graph", "diloco")


def test_tensorflow_api_under_launcher():
    """Two workers, one server: every case, the equivalence ones against one process with batch 2b."""
    assert_ok(launch(2, 1, [sys.executable, WORKER, "all"]), 2, ALL)


def test_keras_torch_backend_under_launcher():
    """KERAS_BACKEND=torch: the same Keras script, gradients straight into pushpull.torch's engine."""
    assert_ok(launch(2, 1, [sys.executable, WORKER, "keras", "warmup", "diloco"], env={"KERAS_BACKEND": "torch"}), 2,
              ("keras", "warmup", "diloco"))


def test_tensorflow_api_single_process_mode():
    """One process, no servers: every collective is local and every case still holds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update(ENV)
    res = subprocess.run([sys.executable, WORKER, "all"], capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env=env)
    assert_ok(res, 1, ALL)


def test_keras_example_reaches_accuracy_with_two_workers():
    res = launch(2, 1, [sys.executable, EXAMPLE, "--min-accuracy", "0.95", "--json", "--no-progress"])
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines() if "{" in ln and "test_accuracy" in ln]
    assert lines, out[-3000:]
    s = json.loads(lines[-1])
    assert s["workers"] == 2 and s["test_accuracy"] >= 0.95, s
    assert "final: test_accuracy=" in out
