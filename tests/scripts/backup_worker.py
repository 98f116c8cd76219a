"""Backup workers under the launcher (3 workers, PUSHPULL_BACKUP_WORKERS=1): rank 2 is late for round 2 and
a straggler afterwards. Each rank's gradient of w is c_r = 2**r (exact in float32), SGD with lr 1, so the
weight after a round says exactly whose gradients its average held. Prints what tests/cluster/test_backup.py checks."""
import json
import sys
import time

import torch

import pushpull.torch as bps

bps.init()
r, n = bps.rank(), bps.size()
model = torch.nn.Linear(1, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(100.0)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters())
c = float(2 ** r)


def step() -> None:
    opt.zero_grad()
    (model.weight.sum() * c).backward()
    opt.step()


step()  # round 1 declares the key on the servers, which waits for every worker
bps.barrier()
before = model.weight.item()
t0 = time.perf_counter()
if r == n - 1:
    time.sleep(2.0)  # late for round 2: the others complete it without this rank
step()
print(f"ROUND2 rank={r} before={before!r} weight={model.weight.item()!r} "
      f"seconds={time.perf_counter() - t0:.3f}", flush=True)
bps.barrier()
t0 = time.perf_counter()
while opt.rounds < 21:  # a straggler: 0.3 s per step on the last rank, none on the others
    if r == n - 1:
        time.sleep(0.3)
    step()
seconds = time.perf_counter() - t0
bps.barrier()
weights = bps.allgather_object(model.weight.item())
dropped = bps.late_pushes()
print("STRAGGLER " + json.dumps({"rank": r, "rounds": opt.rounds, "catch_up": opt.catch_up_steps,
                                 "seconds": seconds, "weights": weights, "dropped": dropped}), flush=True)
bps.shutdown()
print("ALL-OK", flush=True)
sys.exit(0)
