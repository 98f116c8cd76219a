"""The command line says what is true: help texts, and errors that say what to do."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pushpull.cli import COMMANDS


def _pp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pushpull", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_is_plain_text(command):
    res = _pp(command, "--help")
    assert res.returncode == 0, res.stderr
    assert "``" not in res.stdout and ":class:" not in res.stdout and ":mod:" not in res.stdout


def test_cluster_summary_names_its_real_subcommands():
    top = _pp("--help").stdout
    line = next(ln for ln in top.splitlines() if ln.strip().startswith("cluster"))
    sub = _pp("cluster", "--help").stdout
    for name in ("check", "measure", "launch", "torch", "cleanup"):
        assert name in line and name in sub
    assert "up," not in line


def test_launch_without_dashdash_says_where_it_goes():
    res = _pp("launch", "--workers", "2", "python", "train.py", "--epochs", "3")
    assert res.returncode == 2 and "put -- before it" in res.stderr, res.stderr


def test_launch_names_a_command_that_does_not_exist():
    res = _pp("launch", "--workers", "2", "--", "pyton-not-here", "train.py")
    assert res.returncode == 2 and "'pyton-not-here' was not found" in res.stderr, res.stderr


def test_a_byteps_style_worker_launch_reads_the_pushpull_names_of_worker_id_and_local_size():
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    env.update(PUSHPULL_ROLE="worker", PUSHPULL_WORKER_ID="1", PUSHPULL_LOCAL_SIZE="2")
    show = "import os; e = os.environ; print('local', e['BYTEPS_LOCAL_RANK'], e['BYTEPS_LOCAL_SIZE'], " \
           "'PUSHPULL_LOCAL_SIZE' in e)"
    res = subprocess.run([sys.executable, "-m", "pushpull", "launch", "--", sys.executable, "-c", show],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    lines = sorted(ln for ln in res.stdout.splitlines() if "local" in ln)
    assert len(lines) == 2 and lines[0].endswith("local 0 2 False") and lines[1].endswith("local 1 2 False"), lines
    assert "worker 2" in lines[0] and "worker 3" in lines[1], lines  # ranks of worker machine 1 of size 2
