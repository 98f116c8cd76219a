"""Where Horovod's own test suite found pushpull differing (issue 28, findings 1-9), each as Horovod's
documentation says it should be, under the real launcher with 2 and 3 workers.

Two launches per worker count (tests/scripts/parity_worker.py): the ``main`` cases, and the ``deadline``
cases, where a rank stays away on purpose under PUSHPULL_TIMEOUT=2 (join() and multi-key operations must
fail after one deadline naming the missing rank). One reported test per case and worker count.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "scripts" / "parity_worker.py"
sys.path.insert(0, str(WORKER.parent))
import parity_worker  # noqa: E402

SHAPES = {2: 1, 3: 2}  # workers -> servers
TIMEOUT = {"main": 20, "deadline": 2}
_runs: dict = {}


def _job(workers: int, which: str) -> str:
    if (workers, which) not in _runs:
        argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers",
                str(SHAPES[workers]), "--env", f"PUSHPULL_TIMEOUT={TIMEOUT[which]}", "--env", "OMP_NUM_THREADS=1",
                "--", sys.executable, str(WORKER), which]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert out.count("ALL-DONE") == workers, out[-4000:]
        _runs[workers, which] = out
    return _runs[workers, which]


def _assert_case(out: str, name: str, workers: int) -> None:
    failed = [ln for ln in out.splitlines() if re.search(rf"CASE {re.escape(name)} FAIL", ln)]
    assert not failed, "\n".join(failed)
    assert len(re.findall(rf"CASE {re.escape(name)} ok ", out)) == workers, out[-3000:]


@pytest.mark.parametrize("workers", list(SHAPES))
@pytest.mark.parametrize("name", list(parity_worker.MAIN))
def test_main(workers, name):
    _assert_case(_job(workers, "main"), name, workers)


@pytest.mark.parametrize("workers", list(SHAPES))
@pytest.mark.parametrize("name", list(parity_worker.DEADLINE))
def test_deadline(workers, name):
    _assert_case(_job(workers, "deadline"), name, workers)


@pytest.mark.parametrize("workers", list(SHAPES))
def test_join_peer_left_without_join(workers):
    """A rank that shuts down without join() while the others wait in it: they raise within seconds naming
    it (PUSHPULL_TIMEOUT is 30 s here), instead of waiting out the deadline."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(SHAPES[workers]),
            "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1", "--", sys.executable, str(WORKER), "leaver"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = res.stdout + res.stderr
    assert out.count("LEFT") == 1, out[-3000:]
    _assert_case(out, "f3-peer-left", workers - 1)
