"""mpirun -np N python train.py: the job starts its own scheduler and servers (pushpull.launch.hpc) with the
real Open MPI (Debian's openmpi-bin, which scripts/install.sh installs; skipped, naming it, without)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import procs
import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="no mpirun here (Debian: apt-get install openmpi-bin)")


def _roles_of_mpi_jobs() -> list[int]:
    """Scheduler and server processes started under mpirun (their environment holds Open MPI's size)."""
    return procs.roles(b"OMPI_COMM_WORLD_SIZE=")


@pytest.fixture(scope="module")
def mpi_job() -> tuple[int, str, float]:
    argv = [MPIRUN, "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1",
            sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", "4", "--model", "mlp",
            "--no-progress", "--min-accuracy", "0.9"]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    return res.returncode, res.stdout + res.stderr, time.monotonic() - t0


def test_mpirun_trains_the_digits_example_on_two_workers(mpi_job):
    rc, out, _ = mpi_job
    assert rc == 0, out[-3000:]
    assert "2 worker(s)" in out, out[-3000:]
    final = re.search(r"final: test_accuracy=([\d.]+)", out)
    assert final and float(final.group(1)) >= 0.9, out[-3000:]


def test_mpirun_leaves_no_scheduler_or_server_behind(mpi_job):
    deadline = time.monotonic() + 10
    while _roles_of_mpi_jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _roles_of_mpi_jobs() == []
