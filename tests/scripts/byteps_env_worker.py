"""A worker as BytePS's own test harness runs one (its tests/meta_test.py, described in its docs): roles from
DMLC_* variables alone, no job secret, and for every test case in one process: start a scheduler and a server,
init(), reduce, shutdown(), wait for the scheduler and the server to exit, and go on to the next case on the
same port. Worker 0 starts the scheduler and the server. Prints ``CASE <i> ok <seconds>`` per case."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

import pushpull.torch as bps

CASES = int(sys.argv[1]) if len(sys.argv) > 1 else 2
BPSLAUNCH = [sys.executable, "-c", "from pushpull.launch.cli import bpslaunch_main; bpslaunch_main()"]


def start(role: str) -> subprocess.Popen:
    return subprocess.Popen(BPSLAUNCH, env=dict(os.environ, DMLC_ROLE=role), stdin=subprocess.DEVNULL)


def main() -> None:
    me = int(os.environ["DMLC_WORKER_ID"])
    n = int(os.environ["DMLC_NUM_WORKER"])
    for case in range(CASES):
        t0 = time.monotonic()
        infra = [start("scheduler"), start("server")] if me == 0 else []
        bps.init()
        assert bps.size() == n, (bps.size(), n)
        x = torch.arange(1000, dtype=torch.float32) * (me + 1)
        out = bps.push_pull(x, average=False, name=f"case{case}")
        want = torch.arange(1000, dtype=torch.float32) * (n * (n + 1) // 2)
        assert torch.equal(out, want), (out[:4], want[:4])
        bps.shutdown()
        for p in infra:  # BytePS's harness joins them: shutdown() must have let them end
            rc = p.wait(timeout=30)
            assert rc == 0, f"a role exited with {rc}"
        print(f"CASE {case} ok {time.monotonic() - t0:.1f}", flush=True)
        time.sleep(0.5)
    print("ALL-OK", flush=True)


if __name__ == "__main__":
    main()
