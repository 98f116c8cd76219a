"""Elastic training under the launcher (--workers 3 --min-workers 2): the worker that started as rank 1
kills itself (SIGKILL) in the middle of epoch 2; the two survivors (ranks 0 and 2, now 0 and 1) must go on
from their last commit at size 2 and finish with identical parameters, averaging over two workers."""
import os
import signal
import sys
import time

import torch
from elastic_common import elastic_linear, exit_unless_parameters_agree, hold_until_generation, step as one_step

import pushpull.torch as bps
from pushpull.bench.victims import kill_a_server

KILL = os.environ.get("ELASTIC_KILL", "worker")  # what dies mid-run: this script's rank 1, or a server
# the launcher starts a replacement for what died (--restart-workers, --restart-servers): once the loss is seen (the
# job's first change), hold until the replacement is in (its second), so that it joins a job still running
HOLD = os.environ.get("ELASTIC_HOLD") == "1"

bps.init()
late = bps.engine().joined_late  # a replacement (--restart-workers): it joined the running job
first_rank = bps.engine().first_rank
print(f"START first rank {first_rank} rank {bps.rank()} size {bps.size()} late {late}", flush=True)
# tensors declared before the loss (some of them live on the server that dies): their sums must stay exact
checks = {f"elastic.sum{i}": torch.full((3000,), float(first_rank + i)) for i in range(6)}
for name, t in checks.items():
    if not late:  # the others declared them before it came
        bps.push_pull(t, average=False, name=name)
if not late:
    bps.barrier()  # a barrier before the change: a late worker must count its barriers on from here
model, opt, state, x_all, y_all = elastic_linear(first_rank)
# op=Sum made before the change and stepped after it: the sum over the workers of then, not of before
summed = torch.nn.Parameter(torch.zeros(4))
sum_opt = bps.DistributedOptimizer(torch.optim.SGD([summed], lr=1.0), named_parameters=[("elastic.summed", summed)],
                                   op=bps.Sum)


@bps.elastic.run
def train(state):
    while state.epoch < 5:
        rank, size = bps.rank(), bps.size()  # read again at each epoch: they change after a reset
        state.sizes = state.sizes + [size]
        idx = torch.arange(rank, 600, size)
        for step in range(10):
            if HOLD and bps.engine().gen == 1:
                hold_until_generation(2)
            if first_rank == 1 and state.epoch == 2 and step == 4 and KILL == "worker" and not late:
                print("VICTIM dies now", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if first_rank == 0 and state.epoch == 2 and step == 4 and KILL == "server" and not state.resets:
                kill_a_server(bps.config().root_port)
                time.sleep(1.0)  # the change reaches the job mid-epoch (these epochs take milliseconds)
            b = idx[step * 20:(step + 1) * 20]
            one_step(model, opt, x_all[b], y_all[b])
        state.epoch += 1
        state.commit()


train(state)
bps.barrier()  # every worker, the late one included: the same barrier number on all
exit_unless_parameters_agree(model, "elastic.check", "the survivors")
firsts = bps.push_pull(torch.tensor([float(first_rank)]), average=False, name=f"elastic.firsts{bps.size()}").item()
for i, (name, t) in enumerate(checks.items()):  # each survivor pushes first_rank + i
    got = bps.push_pull(t, average=False, name=name)
    want = firsts + i * bps.size()
    if not torch.equal(got, torch.full_like(t, want)):
        print(f"FAIL: {name} summed to {got[0].item()}, want {want}", flush=True)
        sys.exit(3)
summed.grad = torch.ones(4)
sum_opt.step()
if not torch.equal(summed.detach(), torch.full((4,), -float(bps.size()))):
    print(f"FAIL: op=Sum of ones over {bps.size()} workers stepped to {summed.detach().tolist()}", flush=True)
    sys.exit(3)
print(f"ELASTIC rank {first_rank}->{bps.rank()} size {bps.size()} resets {state.resets} sizes {state.sizes} "
      f"late {late}",
      flush=True)
bps.shutdown()
print("ALL-OK", flush=True)
