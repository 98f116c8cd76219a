"""Communication strategies over both backends, the all-reduce ordering, and
layer-wise updates.

These tests run tests/scripts/strategy_worker.py under the real launcher
(the planning functions and every strategy against a fake backend, without
processes: tests/unit/test_strategies.py): every strategy's averaged gradients equal the plain average
and its parameters after K steps equal wfbp's and a single-process
reference; all-reduce ranks submit in different orders without deadlock and
a size mismatch fails on every rank; ScheduledOptimizer equals
DistributedOptimizer for SGD+momentum and Adam with StepLR.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "strategy_worker.py")


# --------------------------------------------------------------------------- real clusters
def launch(workers: int, servers: int, cases: list[str], env: dict, timeout: float = 150):
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in {"PUSHPULL_TIMEOUT": "40", **env}.items():
        argv += ["--env", f"{k}={v}"]
    argv += ["--", sys.executable, WORKER, *cases]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert out.count("ALL-OK") == workers, out[-5000:]
    return out


def test_strategies_over_parameter_servers():
    out = launch(2, 2, ["sums", "train", "layerwise"], {"PUSHPULL_BACKEND": "ps"})
    assert out.count("case layerwise ok") == 2


def test_strategies_over_allreduce_with_rank_dependent_order():
    out = launch(3, 1, ["sums", "order", "mismatch", "train", "layerwise"], {"PUSHPULL_BACKEND": "allreduce"})
    assert out.count("MISMATCH-ERROR") == 3 and "'mismatched'" in out
    assert out.count("case order ok") == 3


def test_allreduce_reduces_a_large_tensor_in_pieces_side_by_side():
    """A CPU tensor larger than SPLIT_BYTES goes in several collectives on the backend's own gloo group (of
    GLOO_THREADS threads), which a link with delay needs (pushpull/torch/allreduce_backend.py); every element
    of the sum lands in place, in rank-dependent submission orders."""
    out = launch(3, 1, ["pieces"], {"PUSHPULL_BACKEND": "allreduce"})
    assert out.count("case pieces ok") == 3


def test_allreduce_fuses_small_tensors_of_mixed_dtypes():
    """Tensor fusion in the all-reduce backend: mixed dtypes and a large tensor between small ones, in
    rank-dependent orders, reduce right; a dtype changed after first use fails that tensor by name."""
    out = launch(3, 1, ["fusion"], {"PUSHPULL_BACKEND": "allreduce"})
    assert out.count("case fusion ok") == 3
    assert out.count("DTYPE-CHANGED-ERROR") == 1 and "'fusion.changes'" in out
