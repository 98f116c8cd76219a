"""elastic.run under ``torchrun --nnodes 1:2`` (tests/cluster/test_torchrun.py): node B's worker kills its agent
and itself in epoch 3; torchrun restarts node A's worker alone, which resumes from the commit A's node kept
(PUSHPULL_ELASTIC_DIR); node C then joins, torchrun restarts A's worker again beside C's, and both resume from
A's newest commit. Every epoch records the job's size in the state, so the final state tells the whole story."""
import os
import signal
import sys
import time

import torch

import pushpull.torch as bps

NODE = os.environ["NODE_NAME"]
EPOCHS = int(os.environ.get("ELASTIC_EPOCHS", "60"))
bps.init()
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
print(f"START node {NODE} pid {os.getpid()} restart {restart} rank {bps.rank()} size {bps.size()}", flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
state = bps.elastic.TorchState(model, opt, epoch=0, sizes=[])
g = torch.Generator().manual_seed(0)
x_all, w_true = torch.randn(600, 8, generator=g), torch.randn(8, 1, generator=g)
y_all = x_all @ w_true


@bps.elastic.run
def train(state):
    print(f"RESUMED node {NODE} epoch {state.epoch} commits {state._commits} rank {bps.rank()} size {bps.size()}",
          flush=True)
    alone = 0
    while state.epoch < EPOCHS:
        rank, size = bps.rank(), bps.size()
        if size == 1 and alone == 2:  # two epochs alone are enough: wait here, committed, for the new node
            deadline = time.time() + 90  # (its joining ends this process; the test fails if it never comes)
            while time.time() < deadline:
                time.sleep(0.1)
        alone += size == 1
        idx = torch.arange(rank, 600, size)
        for step in range(10):
            time.sleep(0.025)
            if NODE == "B" and state.epoch == 3 and step == 5:
                print("VICTIM node B: its agent and worker die now", flush=True)
                os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            b = idx[step * 20:(step + 1) * 20]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x_all[b]), y_all[b]).backward()
            opt.step()
        state.sizes = state.sizes + [size]
        state.epoch += 1
        state.commit()


train(state)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
total = bps.push_pull(flat.clone(), average=False, name="torchrun.elastic.check")
if not torch.allclose(total, flat * bps.size(), atol=1e-6):
    print(f"FAIL: parameters differ across the nodes: {total - flat * bps.size()}", flush=True)
    sys.exit(3)
print(f"FINAL node {NODE} rank {bps.rank()} size {bps.size()} epoch {state.epoch} sizes {state.sizes}", flush=True)
bps.shutdown()
