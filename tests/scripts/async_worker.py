"""AsyncOptimizer: every worker starts from rank 0's parameters, its deltas all land on the servers, and
plain reductions in the same job still sum. With the argument ``setting`` the optimizer is a plain
DistributedOptimizer, which BYTEPS_ENABLE_ASYNC=1 (set by the test) must make asynchronous."""
import sys

import torch

import pushpull.torch as bps

bps.init()
r, n = bps.rank(), bps.size()
torch.manual_seed(r)  # different on purpose
model = torch.nn.Linear(4, 1, bias=False)
start = bps.push_pull(model.weight.detach().clone() if r == 0 else torch.zeros(1, 4), average=False,
                      name="rank0.weight")  # rank 0's initial weight, for the check
if sys.argv[1:] == ["setting"]:
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
else:
    opt = bps.AsyncOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters())
if not torch.equal(model.weight.detach(), start):
    print(f"FAIL: rank {r} did not start from rank 0's parameters: {model.weight.tolist()} vs {start.tolist()}", flush=True)
    sys.exit(3)
for _ in range(5):  # each step moves the weight by -1 (gradient of sum(w) is 1, lr 1)
    opt.zero_grad()
    model.weight.sum().backward()
    opt.step()
bps.barrier()
final = opt._pull_all() or model.weight.detach()
want = start - 5 * n  # every worker's five deltas landed
if not torch.allclose(final, want):
    print(f"FAIL: rank {r} final {final.tolist()} want {want.tolist()}", flush=True)
    sys.exit(3)
total = bps.push_pull(torch.ones(3), average=False, name="plain.sum")
if not torch.equal(total, torch.full((3,), float(n))):
    print(f"FAIL: a plain reduction beside the store keys summed {total.tolist()}", flush=True)
    sys.exit(3)
bps.shutdown()
print("ALL-OK", flush=True)
