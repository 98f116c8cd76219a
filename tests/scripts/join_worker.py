"""Horovod's join(): rank r runs 3 (r + 1) steps of a reduction, then joins; a step's sum counts only the
ranks still running, every rank learns that the last to join was rank n - 1, and after the join every
rank reduces together again."""
import sys

import torch

import pushpull.torch as bps

bps.init()
r, n = bps.rank(), bps.size()
for step in range(3 * (r + 1)):
    got = bps.push_pull(torch.ones(5), average=False, name="join.x")
    active = sum(1 for k in range(n) if 3 * (k + 1) > step)
    if not torch.equal(got, torch.full((5,), float(active))):
        print(f"FAIL: step {step} summed {got[0].item()} with {active} ranks running", flush=True)
        sys.exit(3)
    big = bps.push_pull(torch.ones(300_000), average=False, name="join.big")  # several partitions, engine path
    if not torch.equal(big, torch.full((300_000,), float(active))):
        print(f"FAIL: step {step} big summed {big[0].item()} with {active} ranks running", flush=True)
        sys.exit(3)
last = bps.join()
after = bps.push_pull(torch.ones(5), average=False, name="join.x")
print(f"JOIN rank {r} last {last} after {after[0].item()}", flush=True)
if last != n - 1 or after[0].item() != n:
    print("FAIL: wrong join result", flush=True)
    sys.exit(3)
for rnd in range(3):  # a large key again (shared memory before the join, on servers on this host)
    big = bps.push_pull(torch.full((300_000,), float(rnd)), average=False, name="join.big")
    if not torch.equal(big, torch.full((300_000,), float(rnd * n))):
        print(f"FAIL: after the join, big round {rnd} summed {big[0].item()}", flush=True)
        sys.exit(3)
print(f"JOIN-SHM rank {r} pushes {bps.engine().stats['shm_pushes']}", flush=True)
bps.shutdown()
print("ALL-OK", flush=True)
