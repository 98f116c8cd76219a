"""Worker program for the local reduce's tests (tests/cluster/test_local_reduce.py), one process of a machine.

Cases: ``wire``: sums and averages are exact and this process pushed only its slice of each tensor;
``train``: a few DistributedOptimizer steps on rank-dependent data, final parameters printed;
``dead``: local rank 1 exits before its push, local rank 0 must fail fast naming it.
"""
from __future__ import annotations

import os
import sys
import time

import torch

import pushpull.torch as bps


def fail(msg: str) -> None:
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    sys.exit(3)


def case_wire() -> None:
    r, n = bps.rank(), bps.size()
    eng = bps.engine()
    want_local = os.environ.get("WANT_LOCAL") == "1"
    if (eng.local is not None) != want_local:
        fail(f"local reduce is {'on' if eng.local is not None else 'off'} ({eng.local_reason}), expected "
             f"{'on' if want_local else 'off'}")
    numel = 100_001  # odd: the slices differ by one element
    before = eng.stats["bytes_pushed"]
    for step in range(3):
        x = torch.arange(numel, dtype=torch.float32) % 13 + r + step
        got = bps.push_pull(x, average=False, name="wire.sum")
        want = (torch.arange(numel, dtype=torch.float64) % 13) * n + sum(range(n)) + n * step
        if not torch.equal(got, want.float()):
            fail(f"sum step {step}: max diff {(got.double() - want).abs().max().item()}")
        got = bps.push_pull(x, average=True, name="wire.avg")
        if not torch.allclose(got.double(), want / n, rtol=1e-6, atol=0):
            fail(f"average step {step}: max diff {(got.double() - want / n).abs().max().item()}")
    pushed = eng.stats["bytes_pushed"] - before
    ls = bps.local_size() if want_local else 1
    lo, hi = numel * bps.local_rank() // ls, numel * (bps.local_rank() + 1) // ls
    expect = 6 * (hi - lo) * 4 if want_local else 6 * numel * 4
    if pushed != expect:
        fail(f"pushed {pushed} bytes, expected {expect}")
    # the scheduler flags names declared by only some ranks for 5 s as misnamed: slices are declared by
    # their writers only, and must still work after that
    time.sleep(float(os.environ.get("WIRE_PAUSE", "0")))
    x = torch.arange(numel, dtype=torch.float32) % 13 + r
    got = bps.push_pull(x, average=False, name="wire.sum")
    if not torch.equal(got, ((torch.arange(numel, dtype=torch.float64) % 13) * n + sum(range(n))).float()):
        fail("sum after the pause differs")
    print(f"WIRE-OK rank {r} pushed {pushed}", flush=True)


def case_train() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), model=model)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(100 + bps.rank())
    for _ in range(5):
        x = torch.randn(16, 20, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    print(f"PARAMS rank {bps.rank()} {' '.join(repr(v) for v in flat.tolist())}", flush=True)


def case_dead() -> None:
    x = torch.ones(1000)
    bps.push_pull(x, name="dead.first")  # both alive: fine
    if bps.local_rank() == 1:
        os._exit(0)  # dies without a word, before its next push
    t0 = time.monotonic()
    try:
        bps.push_pull(x, name="dead.second")
    except Exception as ex:  # noqa: BLE001
        print(f"DEAD-ERROR after {time.monotonic() - t0:.2f}s: {ex}", flush=True)
        os._exit(0)
    fail("push_pull with a dead local peer succeeded")


if __name__ == "__main__":
    bps.init()
    {"wire": case_wire, "train": case_train, "dead": case_dead}[sys.argv[1]]()
    bps.shutdown()
    print("ALL-OK", flush=True)
