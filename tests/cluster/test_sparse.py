"""SparseEmbedding over the parameter servers: real processes (2 workers, 2 servers) under the launcher."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "sparse_worker.py")


def _launch(mode: str, **env: str) -> str:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "2", "--",
            sys.executable, WORKER, mode]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, **env})
    out = res.stdout + res.stderr
    assert res.returncode == 0 and out.count("ALL-OK") == 2 and "FAIL" not in out, out[-3000:]
    return out


def test_sparse_training_matches_dense_training_step_by_step():
    out = _launch("equiv")
    assert out.count("step 11: loss dense") == 2, out[-3000:]


def test_rows_are_split_across_servers_at_the_range_boundary():
    _launch("boundary")


def test_a_row_past_the_table_is_refused_naming_the_table_and_row():
    out = _launch("oob")
    assert "row 20, out of range [0, 20)" in out, out[-3000:]


def test_a_table_over_the_servers_byte_limit_is_refused_at_its_declaration():
    out = _launch("limit", PUSHPULL_SPARSE_MAX_TABLE_BYTES="1000000")
    assert "need 12800000 bytes on this server" in out, out[-3000:]


def test_a_join_fails_the_sparse_tables_instead_of_leaving_rounds_waiting():
    out = _launch("join")
    assert "rank 1 joined (join()); sparse tables do not support it" in out, out[-3000:]


def test_a_lookup_waiting_for_a_silent_rank_times_out_naming_it():
    out = _launch("silent", PUSHPULL_TIMEOUT="4")
    assert "rank(s) [1] have not pushed round 1 of it yet" in out, out[-3000:]


@pytest.fixture(scope="module")
def elastic_job() -> str:
    """3 workers, 2 servers, --min-workers 2, replacements for a lost worker and a lost server: a worker dies at
    step 10 and comes back, then a server dies at step 30 and comes back (tests/scripts/elastic_sparse_worker.py)."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--min-workers", "2",
            "--restart-workers", "1", "--restart-servers", "1", "--", sys.executable,
            str(ROOT / "tests" / "scripts" / "elastic_sparse_worker.py")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={**os.environ, "PUSHPULL_SPARSE_COPY_STEPS": "3"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def test_elastic_sparse_tables_end_where_a_run_without_failures_would(elastic_job):
    # each step applied once and none lost, SGD and Adagrad, through 4 changes (the script checks every rank)
    assert elastic_job.count("ALL-OK") == 3 and "FAIL" not in elastic_job, elastic_job[-4000:]


def test_a_lost_servers_rows_come_back_from_the_workers_copies(elastic_job):
    assert re.search(r"server \d \(pid \d+ on \S+\) failed", elastic_job), elastic_job[-4000:]
    assert "a replacement server" in elastic_job, elastic_job[-4000:]


def test_every_change_loads_the_tables_again_on_every_rank(elastic_job):
    # the survivors: the worker lost, the replacement in, the server lost, the server back; the replacement
    # loads them when it comes in and at the two server changes
    assert elastic_job.count("resets 4 resumes 4,4 late False") == 2, elastic_job[-4000:]
    assert elastic_job.count("resets 2 resumes 3,3 late True") == 1, elastic_job[-4000:]
