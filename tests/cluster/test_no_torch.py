"""TensorFlow and Keras users need no PyTorch: every role (scheduler, servers, workers) runs in an environment
where torch is not installed (issue 32: the framework-neutral job context, pushpull/worker/context.py).

The environment is .venv-notorch (scripts/install.sh makes it: ``pip install -e .[tensorflow]`` and
scikit-learn in a fresh virtual environment), or PUSHPULL_NOTORCH_PYTHON. Without one, these tests skip
saying why. The first test checks that torch really is absent there, so the others prove something.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PUSHPULL_TIMEOUT": "30", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
       "PUSHPULL_REGISTER_TIMEOUT": "60"}


def _interpreter() -> tuple[str | None, str]:
    py = os.environ.get("PUSHPULL_NOTORCH_PYTHON") or str(ROOT / ".venv-notorch" / "bin" / "python")
    if not Path(py).exists():
        return None, f"no torch-free environment at {py} (scripts/install.sh makes .venv-notorch)"
    res = subprocess.run([py, "-c", "import tensorflow, pushpull.tensorflow"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    if res.returncode != 0:
        return None, f"{py} cannot import pushpull.tensorflow: {res.stderr.strip().splitlines()[-1:]}"
    return py, ""


PY, WHY = _interpreter()
pytestmark = pytest.mark.skipif(PY is None, reason=WHY)


def _launch(workers: int, servers: int, cmd: list[str], timeout: float = 420) -> str:
    argv = [PY, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in ENV.items():
        argv += ["--env", f"{k}={v}"]
    res = subprocess.run(argv + ["--", PY, *cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    return out


def test_the_environment_has_no_torch():
    res = subprocess.run([PY, "-c", "import torch"], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "No module named 'torch'" in res.stderr, res.stderr[-500:]


def test_keras_example_trains_under_launch_without_torch():
    """The Keras digits example, 2 workers and a server, every process without torch."""
    out = _launch(2, 1, [str(ROOT / "examples" / "train_digits_keras.py"), "--min-accuracy", "0.95", "--json",
                         "--no-progress"])
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines() if "{" in ln and "test_accuracy" in ln]
    assert lines, out[-3000:]
    s = json.loads(lines[-1])
    assert s["workers"] == 2 and s["test_accuracy"] >= 0.95, s


def test_tensorflow_collectives_without_torch():
    """The TensorFlow binding's collectives, Keras and DiLoCo cases (tests/scripts/tf_worker.py); compression, whose
    codecs are written in torch, raises an error that says so."""
    out = _launch(2, 1, [str(ROOT / "tests" / "scripts" / "tf_worker.py"), "collectives", "keras", "graph", "diloco"])
    assert "FAIL" not in out, out[-5000:]
    assert out.count("ALL-OK") == 2, out[-5000:]
