"""Horovod's torch collectives over the parameter servers (issue 15, items 1-4), in the style of
Horovod's test suite: one reported test per collective, op and dtype, each against a plain-torch
reference, under the real launcher with 2 and 3 workers, and alone (single-process mode).

All cases of one worker count share one launch (tests/scripts/coll_worker.py prints ``CASE <name> ok``
per case and goes on after a failure), so the file takes seconds. Agreement errors (ranks that disagree
on dtype, shape, root_rank, op, average or scale factors) must reach every rank within 10 s naming the
tensor, the ranks and their values: the worker checks the text and the time.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "scripts" / "coll_worker.py"
_spec = importlib.util.spec_from_file_location("coll_worker", WORKER)
coll_worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(coll_worker)
CASES = list(coll_worker.CASES)


def _job(workers: int, servers: int) -> str:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers),
            "--env", "PUSHPULL_TIMEOUT=20", "--env", "OMP_NUM_THREADS=1", "--", sys.executable, str(WORKER)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert out.count("ALL-DONE") == workers, out[-4000:]
    return out


@pytest.fixture(scope="module")
def two() -> str:
    return _job(2, 1)


@pytest.fixture(scope="module")
def three() -> str:
    return _job(3, 2)


@pytest.fixture(scope="module")
def alone() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update(OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "ALL-DONE" in out, out[-4000:]
    return out


def _assert_case(out: str, name: str, workers: int) -> None:
    failed = [ln for ln in out.splitlines() if re.search(rf"CASE {re.escape(name)} FAIL", ln)]
    assert not failed, "\n".join(failed)
    assert len(re.findall(rf"CASE {re.escape(name)} (ok|skip) ", out)) == workers, out[-3000:]


@pytest.mark.parametrize("name", CASES)
def test_two_workers(two, name):
    _assert_case(two, name, 2)


@pytest.mark.parametrize("name", CASES)
def test_three_workers(three, name):
    _assert_case(three, name, 3)


@pytest.mark.parametrize("name", CASES)
def test_single_process(alone, name):
    _assert_case(alone, name, 1)
