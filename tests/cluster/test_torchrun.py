"""Plain torchrun (no DMLC_* roles): the job starts its own scheduler and servers and trains."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _roles() -> int:
    return len(subprocess.run(["pgrep", "-f", "pushpull.launch.role"], capture_output=True, text=True).stdout.split())


def test_plain_torchrun_trains_the_example_and_leaves_nothing():
    before = _roles()
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(ROOT / "examples" / "train_digits.py"), "--min-accuracy", "0.95", "--no-progress"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    final = re.search(r"final: test_accuracy=([\d.]+).*workers=(\d)", out)
    assert final and float(final.group(1)) >= 0.95 and final.group(2) == "2", out[-3000:]
    deadline = time.monotonic() + 10
    while _roles() > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _roles() == before, "scheduler or server left running after torchrun returned"
