"""Worker program for the timeline and auto-tuning tests, run under ``pushpull launch``
(or alone, in single-process mode).

Trains a small MLP with DistributedOptimizer for ``--steps`` steps; the
environment turns tracing (PUSHPULL_TRACE_ON) or auto-tuning (PUSHPULL_AUTOTUNE)
on. ``--sigterm-at N`` makes the process SIGTERM itself at step N (the
timeline must still be valid JSON). Prints ALL-OK at the end.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

import pushpull.torch as bps


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sigterm-at", type=int, default=-1)
    ap.add_argument("--explicit-steps", action="store_true", help="count steps with bps.trace_step()")
    args = ap.parse_args()
    bps.init()
    net = model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                                   named_parameters=net.named_parameters(), model=net)
    gen = torch.Generator().manual_seed(1 + bps.rank())
    for step in range(args.steps):
        if step == args.sigterm_at:
            print(f"SIGTERM at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        if args.explicit_steps:
            bps.trace_step()
    # every worker must end with identical parameters (same averaged gradients)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    total = bps.push_pull(flat, average=True, name="check.params")
    if not torch.allclose(total, flat, atol=1e-5):
        print(f"FAIL rank {bps.rank()}: parameters differ across workers", flush=True)
        sys.exit(3)
    bps.shutdown()
    print("ALL-OK", flush=True)


if __name__ == "__main__":
    main()
