"""SparseEmbedding over the parameter servers: real processes (2 workers, 2 servers) under the launcher."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
