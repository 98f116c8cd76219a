"""The short chaos run (issue 30, item 4; the full one is benchmarks/chaos.py's default, 10 minutes): one
elastic job of 4 workers and 2 servers under a SIGKILL or SIGSTOP of a worker, a server and the scheduler, a
few seconds apart, with replacements. It must finish with every step of its epochs applied once, every
integer sum exact and the digits accuracy at least 0.95."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_job_survives_a_worker_a_server_and_the_scheduler_failing(tmp_path):
    out = tmp_path / "chaos.md"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--minutes", "0.4", "--every", "6:9",
                          "--each", "1", "--workers", "4", "--servers", "2", "--no-control", "40", "--seed", "3",
                          "--out", str(out)], capture_output=True, text=True, timeout=420, cwd=ROOT)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-5000:]
    data = json.loads(out.with_suffix(".json").read_text())
    (run,) = data["runs"]
    r = run["result"]
    assert r["applied"] == r["due"] and r["wrong"] == 0 and r["accuracy"] >= 0.95, r
    assert sorted(e["role"] for e in run["events"] if e.get("pid")) == ["scheduler", "server", "worker"], run["events"]
