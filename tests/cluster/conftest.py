"""Fixtures shared by cluster tests."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm():
    """A one-node Slurm on this machine (scripts/slurm-local.sh), or a skip naming why not."""
    if shutil.which("srun") is None:
        pytest.skip("no srun here (Debian: apt-get install slurm-wlm; scripts/install.sh does as root)")
    was_up = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout.strip()
    res = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-local.sh"), "start"], capture_output=True, text=True,
                         timeout=120)
    if res.returncode != 0:
        pytest.skip(f"Slurm could not start here: {(res.stdout + res.stderr).strip()[-500:]}")
    yield
    if not was_up:
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm-local.sh"), "stop"], timeout=60)
