"""BytePS's own test environment (its tests/meta_test.py, as its docs describe it) runs unchanged: roles from
DMLC_* variables alone with no job secret (a loopback-only job uses the user's local secret),
BYTEPS_PARTITION_BYTES far above the message limit (capped, not refused), and a scheduler and server per test
case in one worker process (shutdown() leaves the job, so they exit and the next case starts its own)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pushpull.launch.cli import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "byteps_env_worker.py")


def _env(port: int, workers: int, worker_id: int, secret_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    env.update({"DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
                "DMLC_PS_ROOT_PORT": str(port), "BYTEPS_MIN_COMPRESS_BYTES": "0", "BYTEPS_FORCE_DISTRIBUTED": "1",
                "BYTEPS_PARTITION_BYTES": "2147483647", "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(worker_id),
                "BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "1", "PUSHPULL_LOCAL_SECRET_DIR": str(secret_dir),
                "PUSHPULL_TIMEOUT": "30", "OMP_NUM_THREADS": "1"})
    return env


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def harness(request, tmp_path_factory):
    workers = request.param
    secret_dir = tmp_path_factory.mktemp("secret") / "pushpull"
    port = free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, "2"], env=_env(port, workers, w, secret_dir),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for w in range(workers)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return workers, [p.returncode for p in procs], outs, secret_dir


def test_every_case_reduces_exactly_and_its_roles_exit(harness):
    workers, rcs, outs, _ = harness
    for rc, out in zip(rcs, outs):
        assert rc == 0 and "ALL-OK" in out, out[-3000:]
        assert out.count(" ok ") == 2, out[-3000:]


def test_a_partition_size_above_the_message_limit_is_capped_with_a_warning(harness):
    _, _, outs, _ = harness
    assert "BYTEPS_PARTITION_BYTES" in outs[0] and "ConfigError" not in outs[0], outs[0][-3000:]


def test_the_local_secret_is_private_to_the_user(harness):
    _, _, _, secret_dir = harness
    path = secret_dir / "local_secret"
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret_dir.stat().st_mode) == 0o700
