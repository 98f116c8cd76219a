"""SparseEmbedding tables in an elastic job (--workers 3 --servers 2 --min-workers 2 --restart-workers 1
--restart-servers 1): the worker that started as rank 1 SIGKILLs itself at step 10 and the launcher starts a
replacement; after that change rank 0 SIGKILLs a server at step 30 and the launcher starts it again. Every rank
looks up the same rows with the same gradients each step, so the average is the same at any size, and the tables
(one SGD, one Adagrad) must end where a run without failures would: each step applied once, none lost, the lost
server's rows restored from the workers' copies of the last commit. The commits come 3 and 2 steps apart and the
copies stream over 3 steps (PUSHPULL_SPARSE_COPY_STEPS=3, set by the test): a copy ends at the third step after its
commit or at the next commit, and both changes come while one streams (the job goes back to the commit before)."""
import os
import signal
import sys

import numpy as np
import torch
from elastic_common import hold_until_generation

import pushpull.torch as bps
from pushpull.bench.victims import kill_a_server

ROWS, DIM, STEPS, LR = 40, 4, 50, 0.25

bps.init()
late = bps.engine().joined_late
first_rank = bps.engine().first_rank
print(f"START first rank {first_rank} rank {bps.rank()} size {bps.size()} late {late}", flush=True)
start = torch.arange(ROWS * DIM, dtype=torch.float32).reshape(ROWS, DIM) / 100


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sgd = bps.SparseEmbedding(ROWS, DIM, name="es.sgd", lr=LR, weight=start)
        self.ada = bps.SparseEmbedding(ROWS, DIM, name="es.ada", optimizer="adagrad", lr=LR, weight=start,
                                       initial_accumulator_value=0.1)
        # a dense parameter under DistributedOptimizer (lr 0: it stays 1): a change can interrupt a step after its
        # lookups, in the dense push_pull, and the interrupted step's sparse gradients must not be pushed later
        self.scale = torch.nn.Parameter(torch.ones(1))


def batch(t: int):
    ids = torch.tensor([(t * 7 + k) % ROWS for k in range(6)] + [t % ROWS])  # a row twice at times
    coef = torch.linspace(-1, 1, 7 * DIM).reshape(7, DIM) * (1 + t % 3)
    return ids, coef


net = Net()
killed = []
opt = bps.DistributedOptimizer(torch.optim.SGD([net.scale], lr=0.0), named_parameters=[("scale", net.scale)])
state = bps.elastic.TorchState(net, opt, step=0, sizes=[])


@bps.elastic.run
def train(state):
    while state.step < STEPS:
        t = state.step
        gen = bps.engine().gen  # read once: the I/O thread may move it on between two reads
        if gen in (1, 3):  # a worker, then a server lost: hold until the launcher's replacement is in
            hold_until_generation(gen + 1)
        if first_rank == 1 and t == 10 and not late:
            print("VICTIM dies now", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if first_rank == 0 and t == 30 and state.resets and not killed:
            killed.append(t)  # outside the state: the step is taken again after the change, the kill is not
            kill_a_server(bps.config().root_port)
        ids, coef = batch(t)
        loss = net.scale * ((net.sgd(ids) * coef).sum() + (net.ada(ids) * coef).sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        net.sgd.step()
        net.ada.step()
        state.step += 1
        if state.step % 5 in (0, 2) or state.step == STEPS:
            state.sizes = state.sizes + [bps.size()]
            state.commit()


train(state)

# what a run without failures gives: float64, each step once
want_sgd, want_ada = start.double().numpy(), start.double().numpy()
acc = np.full((ROWS, DIM), 0.1)
for t in range(STEPS):
    ids, coef = batch(t)
    g = np.zeros((ROWS, DIM))
    np.add.at(g, ids.numpy(), coef.double().numpy())
    rows = np.unique(ids.numpy())
    want_sgd[rows] -= LR * g[rows]
    acc[rows] += g[rows] ** 2
    want_ada[rows] -= LR * g[rows] / (np.sqrt(acc[rows]) + 1e-10)
for name, emb, want in (("sgd", net.sgd, want_sgd), ("ada", net.ada, want_ada)):
    err = float(np.abs(emb.table().double().numpy() - want).max())
    if err > 1e-4:
        print(f"FAIL: rank {bps.rank()}: table {name} is {err} from a run without failures", flush=True)
        sys.exit(3)
print(f"SPARSE rank {first_rank}->{bps.rank()} size {bps.size()} resets {state.resets} "
      f"resumes {net.sgd.resumes},{net.ada.resumes} late {late}", flush=True)
bps.barrier()
bps.shutdown()
print("ALL-OK", flush=True)
