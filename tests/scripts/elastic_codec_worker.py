"""Compressed training in an elastic job (--workers 2 --servers 2 --min-workers 1, BYTEPS_FORCE_DISTRIBUTED=1): rank 0
SIGKILLs a server at step 12 (CODEC_KILL=server), or rank 1 SIGKILLs itself there (CODEC_KILL=worker: it held the
copy of half the servers' state); the job goes back to the commit of step 10 and takes the steps since again (after a
lost worker, rank 0 alone, still through the servers). The compression has state on both sides: Nesterov momentum and
error feedback on the workers, error feedback on the servers (top-k). The parameters must end bit for bit where a run
without failures ends: computed here, in this process, with the same codec chains (pushpull.compression.build,
build_server). Every gradient is a small integer, the momentum 0.5 and the average over 2 or 1 workers, so each value
is exact in float32 and the sums do not depend on their order. Without the compression state going back with the
commit (a replayed step's momentum and residual counted twice, a moved key's server residual lost), they end far from
it (printed)."""
import os
import signal
import sys

import torch

import pushpull.torch as bps
from pushpull.bench.victims import kill_a_server
from pushpull.compression import build, build_server, decode_payload

KILL = os.environ.get("CODEC_KILL", "server")
STEPS, LR, SIZES = 16, 0.125, (64, 48, 40, 56)
SPEC = {"compressor": "topk", "k": 0.25, "ef": "vanilla", "momentum": "nesterov", "mu": 0.5, "min_compress_bytes": 0}

bps.init()
first_rank = bps.engine().first_rank
params = [torch.nn.Parameter(torch.arange(n, dtype=torch.float32) % 7) for n in SIZES]
named = [(f"w{i}", p) for i, p in enumerate(params)]


def grad(rank: int, t: int, i: int) -> torch.Tensor:
    n = SIZES[i]
    return ((torch.arange(n) * 7 + t * 3 + rank * 5 + i) % 9 - 4).to(torch.float32)


opt = bps.DistributedOptimizer(torch.optim.SGD(params, lr=LR), named_parameters=named, compression_params=SPEC)
state = bps.elastic.TorchState(torch.nn.ParameterList(params), opt, step=0)
killed = []


@bps.elastic.run
def train(state):
    while state.step < STEPS:
        t = state.step
        if KILL == "server" and first_rank == 0 and t == 12 and not killed:
            killed.append(t)  # outside the state: the steps after the commit are taken again, the kill is not
            kill_a_server(bps.config().root_port)
        if KILL == "worker" and first_rank == 1 and t == 12:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        for i, p in enumerate(params):
            p.grad = grad(bps.rank(), t, i)
        opt.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()


train(state)

# a run without failures, with the same chains: each worker's, then the server's, then the average and SGD (after a
# lost worker: both ranks until the commit of step 10, then rank 0 alone)
keys = {e.name: e.parts[0].key for e in bps.engine().table.entries.values() if e.compression}
want = [torch.arange(s, dtype=torch.float32) % 7 for s in SIZES]
for i in range(len(SIZES)):
    key = next(k for name, k in keys.items() if name.endswith(f"w{i}"))
    workers = [build(SPEC, seed_offset=key, lr_getter=lambda: LR) for _ in range(2)]
    server = build_server(SPEC, seed_offset=key, lr_getter=lambda: LR)
    for t in range(STEPS):
        n = 1 if KILL == "worker" and t >= 10 else 2
        total = sum(decode_payload(workers[r].compress(grad(r, t, i))) for r in range(n))
        want[i].add_(decode_payload(server.compress(total)) * (1.0 / n), alpha=-LR)
err = max(float((p.detach() - w).abs().max()) for p, w in zip(params, want))
print(f"CODEC rank {bps.rank()} resets {state.resets} parts {len(keys)} off by {err}", flush=True)
if err != 0.0 or state.resets != 1 or KILL == "server" and not killed and first_rank == 0:
    print(f"FAIL: rank {bps.rank()}: the parameters are {err} from a run without failures (resets {state.resets})",
          flush=True)
    sys.exit(3)
bps.barrier()
bps.shutdown()
print("ALL-OK", flush=True)
