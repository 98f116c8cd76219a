"""srun and sbatch with the real Slurm (Debian's slurm-wlm: slurmctld and slurmd on this machine, one node,
started by scripts/slurm-local.sh): the job starts its own scheduler and servers (pushpull.launch.hpc) and
trains. Skipped, naming the reason, where Slurm cannot run here."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import procs

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_", "SLURM_"))}


def test_srun_trains_the_digits_example_on_two_workers(slurm):
    res = subprocess.run(["srun", "-n", "2", "--export=ALL,OMP_NUM_THREADS=1", "python",
                          "examples/train_digits.py", "--epochs", "4", "--model", "mlp", "--no-progress",
                          "--min-accuracy", "0.9"], capture_output=True, text=True, timeout=240, cwd=ROOT, env=_env())
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "2 worker(s)" in out, out[-3000:]
    final = re.search(r"final: test_accuracy=([\d.]+)", out)
    assert final and float(final.group(1)) >= 0.9, out[-3000:]


def test_the_sbatch_example_runs_to_its_accuracy(slurm, tmp_path):
    out_file = tmp_path / "digits-%j.out"
    res = subprocess.run(["sbatch", "--wait", f"--output={out_file}", "examples/slurm/train_digits.sbatch",
                          "--epochs", "4", "--model", "mlp", "--min-accuracy", "0.9"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    logs = list(tmp_path.glob("digits-*.out"))
    text = logs[0].read_text() if logs else ""
    assert res.returncode == 0, (res.stdout + res.stderr + text)[-3000:]
    assert "2 worker(s)" in text and re.search(r"final: test_accuracy=0\.9\d*", text), text[-3000:]


def test_no_scheduler_or_server_outlives_the_slurm_job(slurm):
    deadline = time.monotonic() + 10
    while procs.roles(b"SLURM_JOB_ID=") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert procs.roles(b"SLURM_JOB_ID=") == []
