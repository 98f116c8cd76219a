"""pushpull.ray.RayExecutor on a real local Ray cluster (``ray`` from the [ray] extra): scheduler, servers
and workers as Ray actors in one placement group (tests/scripts/ray_driver.py, a process per scenario)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install 'pushpull[ray]'; scripts/install.sh does it)")

ROOT = Path(__file__).resolve().parents[2]
DRIVER = str(ROOT / "tests" / "scripts" / "ray_driver.py")
_runs: dict = {}


def _drive(scenario: str) -> tuple[dict, list[int], str]:
    if scenario not in _runs:
        res = subprocess.run([sys.executable, DRIVER, scenario], capture_output=True, text=True, timeout=600,
                             cwd=ROOT)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        result = json.loads(next(ln.split(" ", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("RESULT ")))
        pids = [int(p) for p in next(ln for ln in res.stdout.splitlines() if ln.startswith("ROLE-PIDS")).split()[1:]]
        _runs[scenario] = (result, pids, out)
    return _runs[scenario]


def test_two_workers_train_the_digits_example_to_its_accuracy():
    result, _, out = _drive("digits")
    runs = sorted(result["runs"], key=lambda r: r["rank"])
    assert [r["rank"] for r in runs] == [0, 1], out[-3000:]
    assert all(r["code"] == 0 for r in runs), runs  # the example exits non-zero below --min-accuracy
    s = runs[0]["summary"]
    assert s["workers"] == 2 and s["test_accuracy"] >= 0.95, s


def test_a_failing_worker_fails_the_run_naming_its_rank_within_seconds():
    result, _, out = _drive("raises")
    assert result["error"] and "worker rank 1 failed" in result["error"] and "on purpose" in result["error"], out
    assert result["seconds"] < 30, result


@pytest.mark.parametrize("scenario", ["digits", "raises"])
def test_no_scheduler_or_server_outlives_the_executor(scenario):
    _, pids, _ = _drive(scenario)
    assert len(pids) == 2  # the scheduler and one server
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().split()[2]]
    assert not alive, f"role processes still running after shutdown: {alive}"
