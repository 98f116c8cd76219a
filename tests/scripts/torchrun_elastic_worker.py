"""elastic.run under ``torchrun --nnodes 1:2`` (tests/cluster/test_torchrun.py): node B's worker kills its agent
and itself in epoch 3; torchrun restarts node A's worker alone, which resumes from the commit A's node kept
(PUSHPULL_ELASTIC_DIR); node C then joins, torchrun restarts A's worker again beside C's, and both resume from
A's newest commit. Every epoch records the job's size in the state, so the final state tells the whole story."""
import os
import signal
import time

import torch
from elastic_common import elastic_linear, exit_unless_parameters_agree, step as one_step

import pushpull.torch as bps

NODE = os.environ["NODE_NAME"]
EPOCHS = int(os.environ.get("ELASTIC_EPOCHS", "12"))
bps.init()
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
print(f"START node {NODE} pid {os.getpid()} restart {restart} rank {bps.rank()} size {bps.size()}", flush=True)
model, opt, state, x_all, y_all = elastic_linear(0)


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
        for step in range(10):  # (no step needs slowing: A alone waits above for the new node)
            if NODE == "B" and state.epoch == 3 and step == 5:
                print("VICTIM node B: its agent and worker die now", flush=True)
                os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            b = idx[step * 20:(step + 1) * 20]
            one_step(model, opt, x_all[b], y_all[b])
        state.sizes = state.sizes + [size]
        state.epoch += 1
        state.commit()


train(state)
exit_unless_parameters_agree(model, "torchrun.elastic.check", "the nodes")
print(f"FINAL node {NODE} rank {bps.rank()} size {bps.size()} epoch {state.epoch} sizes {state.sizes}", flush=True)
bps.shutdown()
