"""Worker program for the CUDA checks (tests/cluster/test_cuda.py, scripts/gpu-check.sh): CUDA tensors through
every path a GPU user takes (DiLoCo's too), under the real launcher. It runs only where CUDA is available; the
test skips elsewhere.

Every expected value is rebuilt locally from (rank, step), as in api_worker.py. A result must come back on the
tensor's own device, with its dtype, and right: exact for integers, to rounding for floats.
"""
from __future__ import annotations

import argparse
import os

import torch
from torch import nn

import pushpull.torch as bps
from cases import run_cases

# PUSHPULL_TEST_DEVICE=cpu runs the same cases on the CPU: how the checks themselves are checked without a GPU
DEV = torch.device(os.environ.get("PUSHPULL_TEST_DEVICE", "cuda:0"))
# the one compressor of each kind the registry has, with the wrappers (error feedback, momentum) on one of them
COMPRESSIONS = {
    "fp16": {},
    "onebit": {"scaling": True, "ef": "vanilla"},
    "topk": {"k": 0.05, "ef": "vanilla"},
    "randomk": {"k": 0.05, "seed": 7, "ef": "vanilla"},
    "dithering": {"k": 4},
    "onebit_momentum": {"scaling": True, "ef": "vanilla", "momentum": "nesterov", "mu": 0.9},
}


def fail(msg: str) -> None:
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    raise AssertionError(msg)


def check_on_device(name: str, out: torch.Tensor, like: torch.Tensor) -> None:
    if out.device != like.device or out.dtype != like.dtype or out.shape != like.shape:
        fail(f"{name}: came back as {out.device}/{out.dtype}/{tuple(out.shape)}, sent "
             f"{like.device}/{like.dtype}/{tuple(like.shape)}")


def per_rank(r: int, shape, dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + r)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int64).to(dtype)


def case_push_pull() -> None:
    """push_pull of CUDA tensors of each dtype, big (several keys) and small: sum exact for integers."""
    r, n = bps.rank(), bps.size()
    for i, (dtype, numel, average) in enumerate([(torch.float32, 300_000, True), (torch.float32, 7, False),
                                                 (torch.float16, 50_000, False), (torch.bfloat16, 40_000, True),
                                                 (torch.int64, 100_000, False), (torch.int32, 33, False),
                                                 (torch.float64, 20_000, True)]):
        x = per_rank(r, (numel,), dtype, i).to(DEV)
        out = bps.push_pull(x, average=average, name=f"cuda.pp.{i}")
        check_on_device(f"push_pull {dtype}", out, x)
        want = sum(per_rank(q, (numel,), dtype, i).to(torch.float64) for q in range(n))
        if average:
            want = want / n
        got = out.cpu().to(torch.float64)
        if dtype.is_floating_point:
            tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
            if not torch.allclose(got, want, rtol=tol, atol=tol * n):
                fail(f"push_pull {dtype}: max error {(got - want).abs().max().item():.3g}")
        elif not torch.equal(got, want):
            fail(f"push_pull {dtype}: integer sum not exact")


def case_inplace_async() -> None:
    """push_pull_inplace and several push_pull_async in flight at once, on CUDA tensors."""
    r, n = bps.rank(), bps.size()
    xs = [per_rank(r, (10_000 * (j + 1),), torch.float32, 20 + j).to(DEV) for j in range(4)]
    handles = [bps.push_pull_async(x, average=False, name=f"cuda.async.{j}") for j, x in enumerate(xs)]
    for j, h in enumerate(handles):
        out = bps.synchronize(h)
        check_on_device("push_pull_async", out, xs[j])
        want = sum(per_rank(q, (10_000 * (j + 1),), torch.float32, 20 + j) for q in range(n))
        if not torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-4):
            fail(f"push_pull_async {j}: max error {(out.cpu() - want).abs().max().item():.3g}")
    y = per_rank(r, (5000,), torch.float32, 30).to(DEV)
    ptr = y.data_ptr()
    bps.push_pull_inplace(y, average=True, name="cuda.inplace")
    want = sum(per_rank(q, (5000,), torch.float32, 30) for q in range(n)) / n
    if y.data_ptr() != ptr or y.device != DEV:
        fail("push_pull_inplace: the tensor was replaced, not filled in place")
    if not torch.allclose(y.cpu(), want, rtol=1e-5, atol=1e-5):
        fail(f"push_pull_inplace: max error {(y.cpu() - want).abs().max().item():.3g}")


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(DEV)


def batch(r: int, step: int):
    g = torch.Generator().manual_seed(10_000 + 100 * step + r)
    return torch.randn(8, 256, generator=g).to(DEV), torch.randint(0, 10, (8,), generator=g).to(DEV)


def step_against_reference(model, opt, ref, ref_opt, step: int) -> None:
    """One step of ``model`` on this rank's batch, and one of ``ref`` on every rank's batch (the average of
    their losses): what data-parallel training must equal."""
    r, n = bps.rank(), bps.size()
    loss = nn.CrossEntropyLoss()
    opt.zero_grad()
    x, y = batch(r, step)
    loss(model(x), y).backward()
    opt.step()
    ref_opt.zero_grad()
    (sum(loss(ref(batch(q, step)[0]), batch(q, step)[1]) for q in range(n)) / n).backward()
    ref_opt.step()


def expect_same_parameters(what: str, named, ref) -> None:
    for (name, p), q in zip(named, ref.parameters()):
        check_on_device(f"{what} parameter {name}", p.data, q.data)
        if not torch.allclose(p, q, rtol=1e-4, atol=1e-5):
            fail(f"{what}: parameter {name} off by {(p - q).abs().max().item():.3g}")


def case_optimizer() -> None:
    """DistributedOptimizer on a CUDA model equals one process stepping on every rank's batch (averaged)."""
    model, ref = make_model(1), make_model(1)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        step_against_reference(model, opt, ref, ref_opt, step)
    expect_same_parameters("optimizer", model.named_parameters(), ref)


def case_ddp() -> None:
    """pushpull's DistributedDataParallel wrapper around a CUDA model equals one process stepping on every
    rank's batch (averaged gradients), with BatchNorm's buffers taken from rank 0 on the GPU."""
    r = bps.rank()
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(256, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10)).to(DEV)
    ref = nn.Sequential(nn.Linear(256, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10)).to(DEV)
    ref.load_state_dict(net.state_dict())
    net[1].running_mean.fill_(float(r))  # the wrapper must take rank 0's buffers
    model = bps.DistributedDataParallel(net, name="cuda.ddp")
    if not torch.equal(net[1].running_mean.cpu(), torch.zeros(64)):
        fail(f"DistributedDataParallel: BatchNorm buffers not taken from rank 0 ({net[1].running_mean[:3].tolist()})")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref.eval()  # the reference sees every rank's batch: its BatchNorm must not take batch statistics of them all
    model.eval()
    for step in range(3):
        step_against_reference(model, opt, ref, ref_opt, step)
    expect_same_parameters("DistributedDataParallel", net.named_parameters(), ref)


def case_compression() -> None:
    """Each compressor on CUDA gradients: the step runs, and parameters stay on the GPU, finite and moving."""
    r = bps.rank()
    loss = nn.CrossEntropyLoss()
    for cname, kwargs in COMPRESSIONS.items():
        codec = cname.split("_")[0]
        model = make_model(2)
        before = [p.detach().clone() for p in model.parameters()]
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=[(f"{cname}.{k}", v) for k, v in model.named_parameters()],
                                       compression=bps.Compression.build(codec, **kwargs))
        for step in range(2):
            opt.zero_grad()
            x, y = batch(r, step)
            loss(model(x), y).backward()
            opt.step()
        for p, b in zip(model.parameters(), before):
            if p.device != DEV or not torch.isfinite(p).all():
                fail(f"compression {cname}: parameter on {p.device}, finite={bool(torch.isfinite(p).all())}")
        moved = sum((p - b).abs().sum().item() for p, b in zip(model.parameters(), before))
        if moved == 0.0:
            fail(f"compression {cname}: no parameter moved in two steps")


def case_collectives() -> None:
    """allreduce, allgather, broadcast and alltoall of CUDA tensors (Horovod's API over the servers)."""
    r, n = bps.rank(), bps.size()
    x = per_rank(r, (1000,), torch.float32, 40).to(DEV)
    out = bps.allreduce(x, name="cuda.ar", op=bps.Sum)
    check_on_device("allreduce", out, x)
    want = sum(per_rank(q, (1000,), torch.float32, 40) for q in range(n))
    if not torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-4):
        fail("allreduce: wrong sum")
    g = torch.full((r + 1, 3), float(r), device=DEV)
    gathered = bps.allgather(g, name="cuda.ag")
    if gathered.device != DEV or gathered.shape[0] != sum(q + 1 for q in range(n)):
        fail(f"allgather: {gathered.device} {tuple(gathered.shape)}")
    want_g = torch.cat([torch.full((q + 1, 3), float(q)) for q in range(n)])
    if not torch.equal(gathered.cpu(), want_g):
        fail("allgather: wrong rows")
    b = torch.full((17,), float(r + 5), device=DEV)
    bout = bps.broadcast(b, root_rank=0, name="cuda.bc")
    if bout.device != DEV or not torch.equal(bout.cpu(), torch.full((17,), 5.0)):
        fail(f"broadcast: {bout.device} {bout[:3].tolist()}")
    a = torch.arange(2 * n, dtype=torch.float32, device=DEV) + 100 * r
    aout = bps.alltoall(a, name="cuda.a2a")
    aout = aout[0] if isinstance(aout, tuple) else aout
    want_a = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q for q in range(n)])
    if aout.device != DEV or not torch.equal(aout.cpu(), want_a):
        fail(f"alltoall: {aout.device} {aout.cpu().tolist()} != {want_a.tolist()}")


def case_broadcast_state() -> None:
    """broadcast_parameters and broadcast_optimizer_state of a CUDA model and its Adam state."""
    r = bps.rank()
    model = make_model(100 + r)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = batch(r, 0)
    nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    ref = make_model(100)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.device != DEV:
            fail(f"broadcast_parameters: {name} moved to {p.device}")
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    everyone = bps.allgather(sums.unsqueeze(0), name="cuda.bstate")
    if not torch.equal(everyone.min(0).values, everyone.max(0).values):
        fail("broadcast_parameters: ranks differ after the broadcast")
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0 and v.device != DEV:
                fail(f"broadcast_optimizer_state: {k} on {v.device}")


def local_steps(q: int, start: dict, first: int, steps: int) -> nn.Module:
    """Rank q's model after ``steps`` inner SGD steps (lr 0.1) from ``start``, on its batches from step
    ``first`` on: any rank can rebuild every rank's inner phase."""
    m = make_model(5)
    m.load_state_dict(start)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(first, first + steps):
        opt.zero_grad()
        x, y = batch(q, s)
        nn.CrossEntropyLoss()(m(x), y).backward()
        opt.step()
    return m


def case_diloco() -> None:
    """DiLoCo on a CUDA model (2 rounds of H = 2, outer SGD lr 0.7, Nesterov 0.9): the parameters stay on the
    GPU and equal the outer optimizer (pushpull.outer, on the CPU) applied to the mean of every rank's
    pseudo-gradient, each rank's inner phase rebuilt here."""
    from pushpull.outer import OuterSGD

    r, n, h = bps.rank(), bps.size(), 2
    model = make_model(5)
    global_params = {k: v.clone() for k, v in model.state_dict().items()}  # the servers' after each round
    opt = bps.DiLoCo(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), sync_every=h,
                     outer_lr=0.7, outer_momentum=0.9, nesterov=True, name="cuda.diloco")
    outer = {k: OuterSGD(0.7, 0.9, True) for k in global_params}
    for k, v in global_params.items():
        outer[k].apply(v.cpu().numpy() * n, n)  # the start: every rank's (equal) parameters
    for rnd in range(2):
        for s in range(rnd * h, (rnd + 1) * h):
            opt.zero_grad()
            x, y = batch(r, s)
            nn.CrossEntropyLoss()(model(x), y).backward()
            opt.step()
        locals_ = [local_steps(q, global_params, rnd * h, h).state_dict() for q in range(n)]
        for k in global_params:
            total = sum(global_params[k].cpu().numpy() - loc[k].cpu().numpy() for loc in locals_)
            global_params[k] = torch.from_numpy(outer[k].apply(total, n).copy()).to(DEV)
    if opt.rounds != 3:
        fail(f"DiLoCo: {opt.rounds} outer rounds after 4 steps at H = 2 (the start and 2)")
    for name, p in model.named_parameters():
        check_on_device(f"DiLoCo parameter {name}", p.data, global_params[name])
        if not torch.allclose(p, global_params[name], rtol=1e-4, atol=1e-5):
            fail(f"DiLoCo: parameter {name} off the outer step by {(p - global_params[name]).abs().max().item():.3g}")


def case_streaming() -> None:
    """Streaming DiLoCo on a CUDA model (2 fragments, exchanges overlapping 1 inner step, int8
    pseudo-gradients): every parameter stays on the GPU, finite and moving, and after sync() every rank holds
    the same global parameters."""
    r = bps.rank()
    model = make_model(6)
    before = [p.detach().clone() for p in model.parameters()]
    opt = bps.DiLoCo(torch.optim.AdamW(model.parameters(), lr=1e-3), model.named_parameters(), sync_every=4,
                     fragments=2, overlap=1, compression=bps.Compression.build("int8", block=256),
                     name="cuda.streaming")
    for s in range(9):
        opt.zero_grad()
        x, y = batch(r, s)
        nn.CrossEntropyLoss()(model(x), y).backward()
        opt.step()
    opt.sync()
    for (name, p), b in zip(model.named_parameters(), before):
        check_on_device(f"streaming DiLoCo parameter {name}", p.data, b)
        if not torch.isfinite(p).all():
            fail(f"streaming DiLoCo: parameter {name} not finite")
    if sum((p - b).abs().sum().item() for p, b in zip(model.parameters(), before)) == 0.0:
        fail("streaming DiLoCo: no parameter moved in 9 steps")
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    everyone = bps.allgather(sums.unsqueeze(0), name="cuda.streaming.sums")
    if not torch.equal(everyone.min(0).values, everyone.max(0).values):
        fail("streaming DiLoCo: ranks hold different parameters after sync()")


CASES = {"push_pull": case_push_pull, "inplace_async": case_inplace_async, "optimizer": case_optimizer,
         "ddp": case_ddp, "compression": case_compression, "collectives": case_collectives,
         "broadcast_state": case_broadcast_state, "diloco": case_diloco, "streaming": case_streaming}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", choices=list(CASES) + ["all"])
    args = p.parse_args()
    torch.set_num_threads(1)
    bps.init()
    cases = list(CASES) if "all" in args.cases else args.cases
    eng = bps.engine()
    if eng is not None and getattr(eng, "local", None) is not None:
        print(f"local reduce active on rank {bps.rank()}", flush=True)
    run_cases(CASES, cases, bps.rank(), bps.size(), bps.shutdown)


if __name__ == "__main__":
    main()
