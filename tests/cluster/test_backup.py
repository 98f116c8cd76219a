"""Backup workers (PUSHPULL_BACKUP_WORKERS, Chen et al. 2016): a round of a backup key completes with the
first n - b pushes, a late push is dropped and counted, every rank gets the same sum, and a straggler
catches up. Here a real job under the launcher; the round logic without processes (KeyState):
tests/unit/test_backup.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- a real job: 3 workers, 1 server, b = 1
@pytest.fixture(scope="module")
def job() -> str:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "1",
            "--env", "PUSHPULL_BACKUP_WORKERS=1", "--", sys.executable,
            str(ROOT / "tests" / "scripts" / "backup_worker.py")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and out.count("ALL-OK") == 3, out[-3000:]
    return out


def _round2(out: str) -> dict:
    return {int(m[0]): (float(m[1]), float(m[2]), float(m[3]))
            for m in re.findall(r"ROUND2 rank=(\d) before=([\d.]+) weight=([\d.]+) seconds=([\d.]+)", out)}


def _straggler(out: str) -> dict:
    return {d["rank"]: d for d in (json.loads(ln.split("STRAGGLER ", 1)[1]) for ln in out.splitlines()
                                   if "STRAGGLER " in ln)}


def test_the_fast_workers_complete_a_round_without_the_late_one(job):
    r2 = _round2(job)
    assert r2[0][2] < 1.5 and r2[1][2] < 1.5 and r2[2][2] >= 2.0, r2  # rank 2 slept 2 s before its push


def test_the_round_averages_exactly_the_first_two_pushes(job):
    before, after, _ = _round2(job)[0]
    assert after == before - (1 + 2) / 2  # ranks 0 and 1 pushed 1 and 2; rank 2's 4 was dropped


def test_every_worker_gets_the_same_result_the_late_one_too(job):
    assert len({after for _, after, _ in _round2(job).values()}) == 1, _round2(job)


def test_the_late_push_is_counted_for_the_user(job):
    assert all(d["dropped"].get("2", 0) >= 1 for d in _straggler(job).values()), _straggler(job)


def test_the_server_logs_the_late_pushes_at_shutdown(job):
    assert re.search(r"late pushes dropped \(backup workers\), per rank over 1 key\(s\): \{.*2: \d+", job), \
        job[-2000:]


def test_a_straggler_catches_up_and_every_worker_ends_with_the_same_weights(job):
    st = _straggler(job)
    assert st[2]["catch_up"] > 0 and {d["rounds"] for d in st.values()} == {21}, st
    assert len({tuple(d["weights"]) for d in st.values()}) == 1 and len(set(st[0]["weights"])) == 1, st
