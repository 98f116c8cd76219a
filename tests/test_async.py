"""Asynchronous training (AsyncOptimizer): real processes under the launcher."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _launch(workers: int, *cmd: str) -> str:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", "1", "--", *cmd]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    return out


def test_workers_start_from_rank0_every_delta_lands_and_plain_reductions_still_sum():
    out = _launch(3, sys.executable, str(ROOT / "tests" / "scripts" / "async_worker.py"))
    assert out.count("ALL-OK") == 3 and "FAIL" not in out, out[-3000:]


def test_digits_example_reaches_accuracy_asynchronously_with_three_workers():
    out = _launch(3, sys.executable, str(ROOT / "examples" / "train_digits.py"), "--asynchronous", "--no-progress",
                  "--min-accuracy", "0.95")
    final = re.search(r"final: test_accuracy=([\d.]+).*workers=(\d)", out)
    assert final and float(final.group(1)) >= 0.95 and final.group(2) == "3", out[-3000:]
