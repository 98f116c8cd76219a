"""Worker program for tests/cluster/test_scheduler_restart.py: exact integer sums every step while the
scheduler is SIGKILLed (by rank 0, at step 10) and the launcher starts a new one. A tensor declared and a
barrier entered while no scheduler runs (steps 12 and 14) wait for the new one; another tensor is declared
after it took over (step 40: its key must not collide with the old ones). With ``lose``, the worker started
as rank 2 SIGKILLs itself at step 30, after the takeover: the new scheduler must handle that loss (the others
go on with 2 workers). With ``stop``, rank 0 also SIGSTOPs the new scheduler at step 30: the nodes find it
silent past PUSHPULL_HEARTBEAT_TIMEOUT and name it, and the launcher kills and replaces it (a second
takeover). Prints one RESTART line per
rank."""
from __future__ import annotations

import os
import signal
import sys
import time

import torch

import pushpull.torch as bps
from pushpull.torch import ops
from pushpull.worker.handle import WorkersChanged

STEPS, KILL_AT, LOSE_AT = 50, 10, 30


def main() -> None:
    lose, stop = sys.argv[1:] == ["lose"], sys.argv[1:] == ["stop"]
    bps.init()
    eng = ops.engine()
    first = bps.rank()
    wrong, changes, slowest, step = [], 0, 0.0, 0
    while step < STEPS:
        if step == KILL_AT and bps.rank() == 0 and eng.member.recoveries == 0 and changes == 0:
            print(f"rank 0 kills the scheduler, pid {eng.member.book['scheduler_pid']}", flush=True)
            os.kill(int(eng.member.book["scheduler_pid"]), signal.SIGKILL)
        if stop and step == LOSE_AT and bps.rank() == 0 and eng.member.recoveries == 1:
            # the new scheduler, by the pid its book gave this node at the takeover
            print(f"rank 0 stops the scheduler, pid {eng.member.book['scheduler_pid']}", flush=True)
            os.kill(int(eng.member.book["scheduler_pid"]), signal.SIGSTOP)
        if lose and step == LOSE_AT and first == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        try:
            got = bps.push_pull(torch.full((1000,), first * 1000 + step, dtype=torch.int64), average=False,
                                name="sum")
            if step in (12, 40):  # declared while no scheduler runs (12), and after the takeover (40)
                extra = bps.push_pull(torch.full((7,), float(step)), average=False, name=f"late.{step}")
                if not torch.equal(extra, torch.full((7,), float(step * bps.size()))):
                    wrong.append(f"late.{step}: {extra[:2].tolist()}")
            if step == 14:
                bps.barrier()
        except WorkersChanged:
            changes += 1
            continue
        # the ranks present: the survivors keep their first ranks' values (rank 2 is the one lost)
        firsts = range(3) if bps.size() == 3 else range(2)
        want = sum(f * 1000 + step for f in firsts)
        if not torch.equal(got, torch.full((1000,), want, dtype=torch.int64)):
            wrong.append(f"step {step}: {int(got[0])} != {want}")
        slowest = max(slowest, time.perf_counter() - t0)
        step += 1
        time.sleep(0.05)
    print(f"RESTART rank {bps.rank()} of {bps.size()}: {STEPS} steps, wrong sums {wrong[:3]}, recoveries "
          f"{eng.member.recoveries}, changes {changes}, slowest step {slowest:.2f}s", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
