"""The ``auto`` strategy (PUSHPULL_STRATEGY=auto) in jobs under the real launcher
(tests/scripts/auto_worker.py): every rank takes the same decision, and training with ``auto``
(through a backend switch and a planned strategy) ends with the same parameters as wfbp. Its parts in
one process, with fake backends: tests/unit/test_strategy_auto.py. No timing is asserted.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "auto_worker.py")


# --------------------------------------------------------------------------- real clusters
def launch(workers: int, servers: int, case: str, env: dict, timeout: float = 240) -> list[dict]:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in {"PUSHPULL_TIMEOUT": "60", **env}.items():
        argv += ["--env", f"{k}={v}"]
    argv += ["--", sys.executable, WORKER, case]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert out.count("ALL-OK") == workers, out[-5000:]
    decisions = [json.loads(m) for m in re.findall(r"DECISION (\{.*\})", out)]
    assert len(decisions) == workers, out[-3000:]
    return decisions


def test_auto_job_decides_the_same_on_every_rank_over_ps():
    ds = launch(3, 2, "train", {"PUSHPULL_BACKEND": "ps"})
    assert all(d == ds[0] for d in ds), ds
    assert ds[0]["final"] is not None


def test_auto_job_trains_like_wfbp_through_a_backend_switch():
    # starts over all-reduce, may only pick PS: every rank switches backend and plans fusion from auto's times
    ds = launch(2, 1, "switch", {"PUSHPULL_BACKEND": "allreduce"})
    assert all(d == ds[0] for d in ds) and ds[0]["final"]["backend"] == "ps"


def test_auto_job_with_layerwise_updates_trains_like_wfbp():
    ds = launch(2, 2, "layerwise", {"PUSHPULL_BACKEND": "ps"})
    assert all(d == ds[0] for d in ds)
