"""Worker program for tests/cluster/test_diloco.py: DiLoCo and local SGD (pushpull.torch.DiLoCo) over the
real servers against a reference every rank computes alone: all ranks' inner steps replayed on its own
data, and torch.optim.SGD as the outer optimizer. Prints ``CASE <name> ok`` or ``CASE <name> FAIL <why>``."""
from __future__ import annotations

import sys

import torch

import pushpull.torch as bps

H, ROUNDS, LR = 3, 3, 0.05


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


def inner_steps(m: torch.nn.Module, rank: int, first_step: int) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for s in range(first_step, first_step + H):
        x, y = batch(rank, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()


def reference(n: int, outer: dict) -> list[torch.Tensor]:
    """The global parameters after ROUNDS outer rounds of n workers, computed here alone."""
    glob = model(0)  # rank 0's start, which the broadcast gives everyone
    out_opt = torch.optim.SGD(glob.parameters(), lr=outer["outer_lr"], momentum=outer["outer_momentum"],
                              nesterov=outer["nesterov"])
    for r in range(ROUNDS):
        pseudo = [torch.zeros_like(p) for p in glob.parameters()]
        for w in range(n):
            local = model(0)
            local.load_state_dict(glob.state_dict())
            inner_steps(local, w, r * H)
            for acc, g, l in zip(pseudo, glob.parameters(), local.parameters()):
                acc += (g.detach() - l.detach()) / n
        out_opt.zero_grad()
        for p, g in zip(glob.parameters(), pseudo):
            p.grad = g
        out_opt.step()
    return [p.detach() for p in glob.parameters()]


def run(outer: dict, name: str) -> None:
    rank, n = bps.rank(), bps.size()
    m = model(rank)  # every rank starts elsewhere: DiLoCo's start must give them rank 0's parameters
    opt = bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name=name,
                     **outer)
    for s in range(ROUNDS * H):
        x, y = batch(rank, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    want = reference(n, outer)
    got = [p.detach() for p in m.parameters()]
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want))
    if opt.rounds != ROUNDS + 1:
        print(f"CASE {name} FAIL rank {rank}: {opt.rounds} rounds, {ROUNDS + 1} due", flush=True)
    elif worst > 1e-5:
        print(f"CASE {name} FAIL rank {rank}: parameters differ from the reference by {worst:.3g}", flush=True)
    else:
        print(f"CASE {name} ok rank {rank} (max difference {worst:.1e})", flush=True)


CASES = {"diloco": {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True},
         "localsgd": {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False},
         "momentum": {"outer_lr": 0.5, "outer_momentum": 0.8, "nesterov": False}}


def main() -> None:
    bps.init()
    for name, outer in CASES.items():
        try:
            run(outer, name)
        except Exception as e:  # noqa: BLE001 - reported as the case's failure
            print(f"CASE {name} FAIL rank {bps.rank()}: {type(e).__name__}: {e}", flush=True)
    if bps.size() > 1:
        disagree()
    bps.shutdown()
    print("ALL-DONE", flush=True)


def disagree() -> None:
    """Ranks that give different outer settings fail at the start, on every rank, naming the setting."""
    rank = bps.rank()
    m = model(0)
    try:
        bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(), sync_every=H, name="disagree",
                   outer_lr=0.7 if rank == 0 else 0.5)
    except bps.PushPullError as e:
        ok = "outer_lr" in str(e) and "differs across workers" in str(e)
        print(f"CASE disagree {'ok' if ok else 'FAIL'} rank {rank}: {e}", flush=True)
    else:
        print(f"CASE disagree FAIL rank {rank}: no error", flush=True)


if __name__ == "__main__":
    main()
