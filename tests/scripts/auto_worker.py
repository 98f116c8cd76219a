"""Worker program for tests/cluster/test_strategy_auto.py, run under ``pushpull launch``.

Trains the same small model with ``strategy="auto"`` and with ``wfbp`` for
enough steps to go through auto's measuring, its choice, a possible fallback
and its final pick, checks that both end with the same parameters, and prints
``DECISION {json}``: the part of the decision every rank must share.
"""
from __future__ import annotations

import json
import logging
import sys

import torch

import pushpull.torch as bps

SHARED = ("choice", "runner_up", "final", "kept", "measured", "warmup_step_s", "decided_at_step", "final_at_step")
STEPS = 13  # 3 measuring + 3 confirming + 3 on a fallback + a few with the final pick


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.ReLU(), torch.nn.Linear(96, 96), torch.nn.ReLU(),
                               torch.nn.Linear(96, 10))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(strategy: str, layerwise: bool = False, **opts):
    model = make_model()
    named = [(f"{strategy}{layerwise}.{n}", p) for n, p in model.named_parameters()]
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if layerwise:
        opt = bps.ScheduledOptimizer(model, base, named_parameters=named, strategy=strategy, **opts)
    else:
        opt = bps.DistributedOptimizer(base, named_parameters=named, strategy=strategy, model=model, **opts)
    for step in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(batch(bps.rank(), step)[0]), batch(bps.rank(), step)[1]).backward()
        opt.step()
    if layerwise:
        opt.synchronize()
    st = opt._pp.strategy if layerwise else opt._strategy
    return [p.detach().clone() for p in model.parameters()], st


def check(case: str, layerwise: bool = False, **opts) -> None:
    got, st = train("auto", layerwise, **opts)
    want, _ = train("wfbp")
    for i, (a, b) in enumerate(zip(got, want)):
        if not torch.allclose(a, b, atol=1e-5, rtol=1e-4):
            print(f"FAIL rank {bps.rank()}: {case}: param {i} differs from wfbp by "
                  f"{(a - b).abs().max().item()}", flush=True)
            sys.exit(3)
    if st.phase != "final":
        print(f"FAIL rank {bps.rank()}: {case}: auto still in phase {st.phase} after {STEPS} steps", flush=True)
        sys.exit(3)
    print("DECISION " + json.dumps({k: st.decision.get(k) for k in SHARED}, sort_keys=True), flush=True)
    if bps.rank() == 0:
        print(f"{case}: {st.describe_plan()}", flush=True)


CASES = {
    "train": lambda: check("train"),
    # may only pick PS strategies that switch keys or plan: a backend switch, new names, a seeded plan
    "switch": lambda: check("switch", candidates=["ps:fusion", "ps:bytescheduler"]),
    "layerwise": lambda: check("layerwise", layerwise=True),
}


def main() -> None:
    torch.set_num_threads(1)
    bps.init()
    logging.getLogger("pushpull.auto").setLevel(logging.INFO)
    CASES[sys.argv[1]]()
    from pushpull.torch import allreduce_backend as allreduce

    allreduce.shutdown()
    bps.shutdown()
    print("ALL-OK", flush=True)


if __name__ == "__main__":
    main()
