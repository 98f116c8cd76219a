"""DiLoCo(round_deadline="auto") with a straggler, under pushpull launch --workers 3: the worker of rank 2
sleeps STALL seconds before its 9th inner step, so its push of the round of step 10 comes late. The others'
round completes after the deadline (about 2 s: the floor, since the measured rounds take milliseconds)
without it, and it takes that round's result when it pushes. Every worker prints how long its step 10 took
and whether all end (after sync()) with identical parameters."""
import time

import torch

import pushpull.torch as bps

STALL = 6.0
bps.init()
rank = bps.rank()
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
opt = bps.DiLoCo(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(), sync_every=2,
                 round_deadline="auto", name="deadline")
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)
took = {}
for step in range(1, 13):
    if rank == 2 and step == 9:
        time.sleep(STALL)
    t0 = time.monotonic()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    took[step] = time.monotonic() - t0
opt.sync()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = torch.allclose(bps.allreduce(flat.clone(), op=bps.Sum, name="deadline.check"), flat * bps.size(), atol=1e-6)
print(f"DEADLINE rank {rank}: step 10 took {took[10]:.2f}s; identical parameters {same}", flush=True)
bps.shutdown()
