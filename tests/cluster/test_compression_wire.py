"""Compression through real servers: C(C(x)) semantics, min_compress_bytes, bad specs."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("workers,servers,pool", [(1, 1, 0), (3, 2, 0), (3, 2, 2)],
                         ids=["1w-1s", "3w-2s", "3w-2s-threadpool"])
def test_compressed_push_pull_matches_server_recompression(workers, servers, pool):
    """pool: BYTEPS_THREADPOOL_SIZE, compression and decompression on a pool of threads (same results)."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers),
            "--env", "BYTEPS_FORCE_DISTRIBUTED=1", "--env", f"BYTEPS_THREADPOOL_SIZE={pool}", "--",
            sys.executable, str(ROOT / "tests" / "scripts" / "compress_worker.py")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert out.count("ALL-OK") == workers
