"""Auto-tuning of partition size and credit (pushpull.torch.autotune) in a real two-worker job; the search
and the tuner alone: tests/unit/test_autotune.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pushpull.torch.autotune import read_log

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "trace_worker.py")


def test_two_workers_apply_identical_settings_at_identical_steps(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update({"PUSHPULL_AUTOTUNE": "1", "PUSHPULL_AUTOTUNE_STARTUP_TRIALS": "3", "PUSHPULL_AUTOTUNE_TRIALS": "2",
                "PUSHPULL_AUTOTUNE_WINDOW": "4", "PUSHPULL_AUTOTUNE_WARMUP": "1", "PUSHPULL_TIMEOUT": "60",
                "PUSHPULL_AUTOTUNE_LOG": str(tmp_path / "tune.{rank}.jsonl"), "BYTEPS_SCHEDULING_CREDIT": "2",
                "PUSHPULL_LOG_LEVEL": "info"})
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "2", "--",
            sys.executable, WORKER, "--steps", "40"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    out = res.stdout + res.stderr
    # ALL-OK includes: parameters identical on both workers after all the changes
    assert res.returncode == 0 and out.count("ALL-OK") == 2, out[-4000:]
    logs = [read_log(tmp_path / f"tune.{r}.jsonl") for r in (0, 1)]

    def applied(recs):
        return [(r["step"], r["trial"], r["partition_bytes"], r["credit_bytes"], r["final"])
                for r in recs if r["event"] == "apply"]

    a0, a1 = applied(logs[0]), applied(logs[1])
    assert a0 == a1 and len(a0) == 6 and a0[-1][-1], (a0, a1)
    assert len({(p, c) for _, _, p, c, _ in a0}) >= 3  # the partition size and credit really changed
    trials = [r for r in logs[0] if r["event"] == "trial"]
    assert len(trials) == 5 and not any(r["event"] == "trial" for r in logs[1])
    (best,) = [r for r in logs[0] if r["event"] == "best"]
    fastest = min(trials, key=lambda r: r["step_time_s"])
    assert (best["partition_bytes"], best["credit_bytes"]) == (fastest["partition_bytes"], fastest["credit_bytes"])
    assert a0[-1][2:4] == (best["partition_bytes"], best["credit_bytes"])
    assert "autotune chose partition" in out
