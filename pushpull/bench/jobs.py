"""Run one benchmark as a local pushpull job and read back its JSON result.

The benchmarks measure inside a real job (scheduler, servers, workers as
separate processes); the driver only starts it and reads the one JSON file
rank 0 writes, so a failure shows the job's own output instead of a
traceback from the driver.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def run_job(prog: str, workers: int, servers: int, child: list[str], timeout: float,
            env: dict[str, str] | None = None) -> dict | None:
    """Launch ``child`` (given ``--out FILE`` appended) under ``pushpull launch``; its JSON, or
    None after printing why (the job's output tail, or the timeout) to stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
        for k, v in (env or {}).items():
            cmd += ["--env", f"{k}={v}"]
        cmd += ["--", *child, "--out", out]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"{prog}: no result within {timeout:.0f}s", file=sys.stderr)
            return None
        if res.returncode != 0 or not os.path.exists(out):
            print(res.stdout[-4000:], res.stderr[-4000:], sep="\n", file=sys.stderr)
            print(f"{prog}: the benchmark job failed", file=sys.stderr)
            return None
        with open(out) as f:
            return json.load(f)
