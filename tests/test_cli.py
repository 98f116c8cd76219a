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
