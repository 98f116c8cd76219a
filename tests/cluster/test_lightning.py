"""Lightning 2.x on pushpull (pushpull.lightning.PushPullStrategy): the same LightningModule on the digits
alone and as 2 workers under pushpull launch, torchrun and srun (tests/scripts/lightning_worker.py) reaches
the same validation accuracy, with identical parameters on both workers."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("lightning", reason="the [lightning] extra (lightning) is not installed")
SCRIPT = [str(ROOT / "tests" / "scripts" / "lightning_worker.py"), "6"]
LAUNCHERS = {  # each runs the script with this interpreter (torchrun adds it itself)
    "alone": [sys.executable],
    # the scheduler starts before the workers import Lightning (seconds each on a loaded 2-core machine)
    "pushpull-launch": [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1", "--env",
                        "PUSHPULL_REGISTER_TIMEOUT=120", "--", sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    "srun": ["srun", "-n", "2", "--export=ALL", sys.executable],
}


def _run(name: str) -> list[tuple]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_", "SLURM_"))}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(LAUNCHERS[name] + SCRIPT, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    return re.findall(r"LIGHTNING rank (\d) of (\d): val_acc ([\d.]+); identical parameters (\w+); averages (\d+); "
                      r"train batches (\d+)", out)


@pytest.fixture(scope="module")
def alone() -> tuple:
    rows = _run("alone")
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("launcher", ["pushpull-launch", "torchrun", "srun"])
def test_two_workers_reach_the_accuracy_of_one_process(launcher, alone, request):
    if launcher == "srun":
        request.getfixturevalue("slurm")
    rows = _run(launcher)
    assert sorted(r[0] for r in rows) == ["0", "1"] and all(r[1] == "2" for r in rows), rows
    assert all(r[3] == "True" for r in rows), rows                 # identical parameters
    assert all(int(r[5]) * 2 - 1 <= int(alone[5]) for r in rows), rows  # each worker got half the batches
    assert all(int(r[4]) == 6 * int(r[5]) for r in rows), rows       # every step's gradients averaged
    assert all(abs(float(r[2]) - float(alone[2])) <= 0.02 for r in rows), (rows, alone)
    assert all(float(r[2]) >= 0.93 for r in rows), rows
