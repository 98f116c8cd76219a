"""Worker program for tests/cluster/test_strategies.py, run under ``pushpull launch``.

The backend comes from PUSHPULL_BACKEND. Every case checks against values
computed independently from rank and size, and exits non-zero with a message
naming the strategy when something is wrong. Rank 1 submits gradients in the
reverse order and ranks sleep differently, so ranks never see the same order.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch

import pushpull.torch as bps
from pushpull.torch.executors import make_strategy

STRATEGIES = ["wfbp", "bsp", "fusion", "mgwfbp", "bytescheduler"]
SMALL_SCHED = {"partition_bytes": 40_000, "credit": 80_000}  # many partitions, little credit


def options(strategy: str) -> dict:
    if strategy == "bytescheduler":
        return dict(SMALL_SCHED)
    if strategy == "fusion":
        return {"threshold_bytes": 150_000, "cycle_ms": 10.0}
    return {}


def fail(msg: str) -> None:
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    sys.exit(3)


def close(name: str, got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    if got.shape != want.shape or not torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol):
        diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
        fail(f"{name}: differs (max abs diff {diff}); got {got.flatten()[:4].tolist()} "
             f"want {want.flatten()[:4].tolist()}")


def my_order(items: list) -> list:
    r = bps.rank()
    if r == 1:
        return list(reversed(items))
    if r >= 2:
        items = list(items)
        random.Random(r).shuffle(items)
    return list(items)


# ---------------------------------------------------------------- sums --
SHAPES = [(3, 5), (40_000,), (7,), (128, 300), (1,), (25_003,), (64,)]


def grad_value(rank: int, i: int, step: int, shape, dtype) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n, dtype=torch.float64) % 13 + i + 10 * step) * (rank + 1)).reshape(shape).to(dtype)


def case_sums() -> None:
    """Each strategy: averaged gradients equal the plain average, over 4 steps (warm-up and planned)."""
    r, n = bps.rank(), bps.size()
    for s in STRATEGIES:
        strat = make_strategy(s, **options(s))
        for step in range(4):
            grads = {}
            for i, shape in enumerate(SHAPES):
                dtype = torch.float64 if i == 2 else torch.float32  # a second dtype: separate buffers
                grads[i] = grad_value(r, i, step, shape, dtype)
            for i in my_order(list(reversed(range(len(SHAPES))))):
                strat.on_ready(f"{s}.g{i}", grads[i], -i)
                time.sleep(0.002 * ((i + r) % 3))
            strat.on_backward_done()
            strat.wait_all()
            for i, shape in enumerate(SHAPES):
                want = sum(grad_value(k, i, step, shape, torch.float64) for k in range(n)) / n
                close(f"{s} step {step} g{i}", grads[i], want)
        if s in ("fusion", "mgwfbp"):
            print(f"{s} plan: {strat.describe_plan()}", flush=True)


# ---------------------------------------------------------------- training --
def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.ReLU(), torch.nn.Linear(96, 96), torch.nn.ReLU(),
                               torch.nn.Linear(96, 10))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def reference(steps: int, make_opt, make_sched=None) -> list[torch.Tensor]:
    """Single-process run on the average of every rank's gradient: what all strategies must match."""
    n = bps.size()
    model = make_model()
    opt = make_opt(model.parameters())
    sched = make_sched(opt) if make_sched else None
    for step in range(steps):
        opt.zero_grad()
        acc = [torch.zeros_like(p) for p in model.parameters()]
        for k in range(n):
            model.zero_grad()
            loss_of(model, *batch(k, step)).backward()
            for a, p in zip(acc, model.parameters()):
                a += p.grad
        for a, p in zip(acc, model.parameters()):
            p.grad = a / n
        opt.step()
        if sched:
            sched.step()
    return [p.detach().clone() for p in model.parameters()]


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def steplr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def train(strategy: str, steps: int, make_opt, make_sched=None, layerwise: bool = False, tag: str = ""):
    model = make_model()
    named = [(f"{tag}{strategy}.{n}", p) for n, p in model.named_parameters()]
    base = make_opt(model.parameters())
    if layerwise:
        opt = bps.ScheduledOptimizer(model, base, named_parameters=named, strategy=strategy, **options(strategy))
    else:
        opt = bps.DistributedOptimizer(base, named_parameters=named, strategy=strategy, model=model,
                                       **options(strategy))
    sched = make_sched(opt) if make_sched else None
    r = bps.rank()
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, *batch(r, step)).backward()
        opt.step()
        if sched:
            sched.step()
    if layerwise:
        opt.synchronize()
    return [p.detach().clone() for p in model.parameters()]


def case_train() -> None:
    """Each strategy through DistributedOptimizer: parameters after K steps equal wfbp's and the reference."""
    steps = 4
    ref = reference(steps, sgd)
    got = {s: train(s, steps, sgd) for s in STRATEGIES}
    for s in STRATEGIES:
        for i, (a, b) in enumerate(zip(got[s], got["wfbp"])):
            close(f"train {s} vs wfbp param {i}", a, b)
        for i, (a, b) in enumerate(zip(got[s], ref)):
            close(f"train {s} vs reference param {i}", a, b, atol=1e-5, rtol=1e-4)


def case_layerwise() -> None:
    """ScheduledOptimizer == DistributedOptimizer after K steps, SGD+momentum and Adam, with StepLR."""
    steps = 5
    for opt_name, make_opt, strategies in (("sgd", sgd, ["wfbp", "bytescheduler"]), ("adam", adam, ["fusion"])):
        plain = train("wfbp", steps, make_opt, steplr, tag=f"lw.{opt_name}.plain.")
        for s in strategies:
            lw = train(s, steps, make_opt, steplr, layerwise=True, tag=f"lw.{opt_name}.")
            for i, (a, b) in enumerate(zip(lw, plain)):
                close(f"layerwise {opt_name}/{s} vs DistributedOptimizer param {i}", a, b, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- all-reduce only --
def case_order() -> None:
    """All-reduce: ranks submit 60 tensors in different orders with different delays; no deadlock, right sums."""
    from pushpull.torch.allreduce_backend import get_reducer

    red = get_reducer()
    r, n = bps.rank(), bps.size()
    for sched in ((0, 0), (40_000, 80_000)):
        red.set_scheduling(*sched)
        for rnd in range(3):
            ids = my_order(list(range(60)))
            xs = {i: torch.full((1000 + 997 * i,), float(i + r + rnd)) for i in ids}
            hs = []
            for i in ids:
                hs.append((i, red.submit(xs[i], f"order.{i}", priority=-i, average=False)))
                if (i + r) % 7 == 0:
                    time.sleep(0.003)
            for i, h in hs:
                red.wait(h, timeout=60)
                want = float(n * (i + rnd) + sum(range(n)))
                if not torch.all(xs[i] == want):
                    fail(f"order: tensor {i} round {rnd} sched {sched}: got {xs[i][:3].tolist()} want {want}")
    print(f"order ok: {red.stats}", flush=True)


def case_mismatch() -> None:
    """All-reduce: a size mismatch fails on every rank with the tensor's name, quickly."""
    from pushpull.torch.allreduce_backend import get_reducer

    red = get_reducer()
    t0 = time.monotonic()
    x = torch.ones(10 if bps.rank() == 0 else 12)
    try:
        red.wait(red.submit(x, "mismatched"), timeout=30)
    except bps.PushPullError as e:
        if "mismatched" not in str(e):
            fail(f"mismatch error does not name the tensor: {e}")
        print(f"MISMATCH-ERROR after {time.monotonic() - t0:.2f}s: {e}", flush=True)
    else:
        fail("size mismatch was not detected")
    y = torch.ones(5)  # the backend still works afterwards
    red.wait(red.submit(y, "after.mismatch", average=False), timeout=30)
    close("after mismatch", y, torch.full((5,), float(bps.size())))


def case_fusion() -> None:
    """All-reduce: small tensors of mixed dtypes (fused per run of one dtype), a large one between them
    (reduced alone), averages and sums, submitted in rank-dependent orders: every result is right; then a
    rank that changes one tensor's dtype after its first use fails that tensor by name, and the tensors
    reduced beside it are still right."""
    from pushpull.torch import allreduce_backend as allreduce

    red = allreduce.get_reducer()
    r, n = bps.rank(), bps.size()
    big = allreduce.FUSE_PART_BYTES // 4 + 10
    kinds = [(torch.float32, 7), (torch.float32, 1), (torch.float64, 5), (torch.float64, 2), (torch.int32, 3),
             (torch.int32, 2), (torch.float32, big), (torch.float32, 1), (torch.float32, 3), (torch.float16, 4),
             (torch.float16, 4), (torch.int64, 9)]   # rank 0 submits in this order: runs of one dtype
    fused_before = red.stats["fused"]
    for rnd in range(3):
        for average in (False, True):
            xs = {i: torch.full((numel,), float(3 * i + r + rnd), dtype=dt) for i, (dt, numel) in enumerate(kinds)}
            hs = [(i, red.submit(xs[i], f"fusion.{i}.{average}", average=average)) for i in my_order(list(xs))]
            for i, h in hs:
                red.wait(h, timeout=60)
                total = n * (3 * i + rnd) + sum(range(n))
                want = total / n if average else total
                if not xs[i].dtype.is_floating_point:
                    want = int(total // n) if average else total
                close(f"fusion: tensor {i} ({xs[i].dtype}) round {rnd} average {average}", xs[i],
                      torch.full_like(xs[i], want), atol=1e-3)
    if red.stats["fused"] == fused_before:
        fail(f"fusion: no tensor was reduced in a fused collective: {red.stats}")
    # a dtype changed after first use, on rank 1 only: that rank fails it by name; the rest stay right
    for rnd in range(2):
        bad = torch.ones(6, dtype=torch.float64 if (r == 1 and rnd == 1) else torch.float32)
        ok = [torch.full((5,), float(r + j)) for j in range(4)]
        hs = [red.submit(bad, "fusion.changes", average=False)]
        hs += [red.submit(x, f"fusion.beside.{j}", average=False) for j, x in enumerate(ok)]
        try:
            red.wait(hs[0], timeout=60)
            if r == 1 and rnd == 1:
                fail("fusion: a dtype changed after first use was not detected")
        except bps.PushPullError as e:
            if not (r == 1 and rnd == 1) or "fusion.changes" not in str(e):
                fail(f"fusion: unexpected error {e}")
            print(f"DTYPE-CHANGED-ERROR: {e}", flush=True)
        for j, (h, x) in enumerate(zip(hs[1:], ok)):
            red.wait(h, timeout=60)
            close(f"fusion: beside the changed tensor, {j} round {rnd}", x, torch.full((5,), float(n * j + sum(range(n)))))
    print(f"fusion ok: {red.stats}", flush=True)


def case_pieces() -> None:
    """All-reduce: a tensor larger than SPLIT_BYTES goes through the backend's own gloo group in several
    collectives side by side, beside a small one, and every element lands where it belongs (exact float64
    sums of rank- and position-dependent values, so a piece reduced into the wrong place shows)."""
    from pushpull.torch import allreduce_backend as allreduce

    red = allreduce.get_reducer()
    if red.cpu_group is None:
        fail("pieces: the backend has no gloo group of its own for CPU tensors")
    r, n = bps.rank(), bps.size()
    numel = 2 * allreduce.SPLIT_BYTES // 8 + 1001   # three pieces of float64
    pos = torch.arange(numel, dtype=torch.float64)
    for rnd in range(2):
        before = red.stats["collectives"]
        big, small = pos * (r + 1) + rnd, torch.full((7,), float(r))
        hs = [red.submit(x, name, average=False) for name, x in my_order([("pieces.big", big),
                                                                           ("pieces.small", small)])]
        for h in hs:
            red.wait(h, timeout=60)
        want = pos * sum(range(1, n + 1)) + n * rnd
        if not torch.equal(big, want):
            bad = (big != want).nonzero()[:3].flatten().tolist()
            fail(f"pieces: round {rnd}, elements {bad} of the large tensor are wrong")
        close(f"pieces: the small tensor beside it, round {rnd}", small, torch.full((7,), float(sum(range(n)))))
        if red.stats["collectives"] - before < 3:
            fail(f"pieces: {numel * 8} bytes went in {red.stats['collectives'] - before} collective(s), not 3 pieces")
    print(f"pieces ok: {red.stats}", flush=True)


CASES = {"sums": case_sums, "train": case_train, "layerwise": case_layerwise, "order": case_order,
         "mismatch": case_mismatch, "fusion": case_fusion, "pieces": case_pieces}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", choices=list(CASES))
    args = p.parse_args()
    torch.set_num_threads(1)  # several workers share few cores: intra-op threads only contend
    from pushpull.torch import allreduce_backend as allreduce
    allreduce.SLOTS = 16  # small order messages: long batches take several (chunking is exercised)
    bps.init()
    for c in args.cases:
        t = time.monotonic()
        CASES[c]()
        print(f"case {c} ok on rank {bps.rank()}/{bps.size()} ({bps.config().backend}) in "
              f"{time.monotonic() - t:.2f}s", flush=True)
    from pushpull.torch import allreduce_backend as allreduce
    allreduce.shutdown()
    bps.shutdown()
    print("ALL-OK", flush=True)


if __name__ == "__main__":
    main()
