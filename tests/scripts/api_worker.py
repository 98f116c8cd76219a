"""Worker program for the PyTorch API tests (tests/cluster/test_torch_api.py), run under
``pushpull launch`` or alone (single-process mode).

Every case computes what it expects independently: data are deterministic
functions of (rank, step), so each worker can rebuild the whole global batch and
train a reference model on it locally. A failure prints ``FAIL rank r: ...`` and
exits non-zero.
"""
from __future__ import annotations

import argparse
import copy
import math
import os

import torch
from torch import nn

import pushpull.torch as bps
from cases import run_cases

D_IN, HIDDEN, D_OUT = 6, 16, 3
LOSS = nn.CrossEntropyLoss()


class Custom:
    """A user object that only pickle can carry (broadcast_object's fallback)."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Custom) and other.v == self.v


class Exploit:
    """What an attacker would broadcast: unpickling it runs a shell command (touches a file)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class CaseFailed(AssertionError):
    """One case's check failed: reported as ``case <name> FAIL``, and the next case runs."""


def fail(msg: str) -> None:
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    raise CaseFailed(msg)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    if a.numel() == 0:
        return True
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(width), b.view(width))


def expect_bits(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not bits_equal(got, want):
        fail(f"{name}: got {got.dtype}{list(got.shape)} {got.flatten()[:4].tolist()}, "
             f"want {want.dtype}{list(want.shape)} {want.flatten()[:4].tolist()}")


def expect_close(name: str, got: nn.Module, want: nn.Module, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for (n, a), (_, b) in zip(got.named_parameters(), want.named_parameters()):
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            fail(f"{name}: parameter {n} differs from the single-process reference "
                 f"(max abs diff {(a - b).abs().max().item():.3g})")


def expect_raises(exc, needle: str, fn, what: str) -> None:
    try:
        fn()
    except exc as e:
        if needle not in str(e):
            fail(f"{what}: error does not mention {needle!r}: {e}")
        return
    fail(f"{what}: no {exc.__name__} raised")


def distributed() -> bool:
    return bps.engine() is not None


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, D_OUT))


def batch(rank: int, step: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(b, D_IN, generator=g), torch.randint(0, D_OUT, (b,), generator=g)


def global_batch(step: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(batch(r, step, b) for r in range(bps.size())))
    return torch.cat(xs), torch.cat(ys)


def named(prefix: str, model: nn.Module):
    return [(f"{prefix}.{n}", p) for n, p in model.named_parameters()]


def reference(steps: int, b: int, lr: float = 0.1, momentum: float = 0.9) -> nn.Module:
    """One process trained on the concatenated batch of all workers (root's init: seed 1)."""
    model = make_model(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for step in range(steps):
        x, y = global_batch(step, b)
        opt.zero_grad()
        LOSS(model(x), y).backward()
        opt.step()
    return model


def worker_model() -> nn.Module:
    """A model initialised differently on every rank, then set to the root's by broadcast."""
    model = make_model(bps.rank() + 1)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


# ------------------------------------------------------------------ broadcast --

def sample_tensors(rank: int) -> dict[str, torch.Tensor]:
    """Tensors of every dtype whose values depend on ``rank``, with awkward bits (-0.0, NaN, inf)."""
    g = torch.Generator().manual_seed(rank)
    f = torch.randn(5, 7, generator=g)
    f[0, :4] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf")])
    ts = {
        "f32": f, "f64": f.double() * 3, "f16": f.half(), "bf16": f.bfloat16(),
        "i64": torch.arange(10) * (rank + 7) - 5, "i32": torch.arange(6, dtype=torch.int32) * -(rank + 1),
        "i16": torch.full((3,), -rank - 1, dtype=torch.int16), "i8": torch.full((4,), -rank - 2, dtype=torch.int8),
        "u8": torch.full((9,), 250 - rank, dtype=torch.uint8),
        "bool": torch.tensor([rank % 2 == 0, rank % 3 == 0, True]),
        "c64": torch.complex(f[1], -f[2]),
        "scalar": torch.tensor(float(rank) - 0.5), "empty": torch.zeros(0), "t": f.t(),  # non-contiguous
        "big": torch.randn(300_000, generator=g),  # several partitions
    }
    return ts


def case_broadcast() -> None:
    r, n = bps.rank(), bps.size()
    for root in range(n):
        ts = sample_tensors(r)
        before = {k: v.clone() for k, v in ts.items()}
        ptrs = {k: v.data_ptr() for k, v in ts.items()}
        bps.broadcast_parameters(ts, root_rank=root, prefix=f"bc.{root}.")
        want = sample_tensors(root)
        for k, v in ts.items():
            if v.data_ptr() != ptrs[k]:
                fail(f"broadcast from {root}: {k} was replaced instead of written in place")
            expect_bits(f"broadcast from {root}: {k}", v, want[k] if r != root else before[k])
        # Horovod's single-tensor forms: broadcast returns a new tensor, broadcast_ writes in place
        t = torch.arange(4.0) * (r + 1)
        got = bps.broadcast(t, root, name=f"one.{root}")
        expect_bits(f"broadcast from {root}: input untouched", t, torch.arange(4.0) * (r + 1))
        expect_bits(f"broadcast from {root}: result", got, torch.arange(4.0) * (root + 1))
        if bps.broadcast_(t, root, name=f"one_.{root}") is not t:
            fail("broadcast_ must return the tensor it was given")
        expect_bits(f"broadcast_ from {root}", t, torch.arange(4.0) * (root + 1))
        # a model's state_dict and its named_parameters (a Parameter that requires grad)
        model = make_model(r + 100)
        bps.broadcast_parameters(model.state_dict(), root_rank=root, prefix=f"bcm.{root}.")
        ref = make_model(root + 100)
        for (k, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
            expect_bits(f"state_dict from {root}: {k}", a, b)
        model = make_model(r + 200)
        bps.broadcast_parameters(model.named_parameters(), root_rank=root, prefix=f"bcn.{root}.")
        ref = make_model(root + 200)
        for (k, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
            expect_bits(f"named_parameters from {root}: {k}", a.detach(), b.detach())
        # objects: JSON-able, pickle-only, a tensor, a large blob, None
        objs = [{"epoch": 3, "lr": 0.1, "tags": ["a", "b"], "root": r}, (1, {2: "x"}, [3.5]), Custom(r),
                torch.arange(5) * r, bytes(range(256)) * 400 + bytes([r]), None, float("nan")]
        for i, obj in enumerate(objs):
            pickled = isinstance(obj, Custom)  # only pickle rebuilds it: the receivers must opt in
            got = bps.broadcast_object(obj if r == root else "not me", root_rank=root,
                                       allow_pickle=True if pickled else None)
            if r == root:
                if got is not obj:
                    fail(f"broadcast_object on the root must return the object itself (object {i})")
                continue
            want = [{"epoch": 3, "lr": 0.1, "tags": ["a", "b"], "root": root}, (1, {2: "x"}, [3.5]), Custom(root),
                    torch.arange(5) * root, bytes(range(256)) * 400 + bytes([root]), None, float("nan")][i]
            if isinstance(want, torch.Tensor):
                ok = torch.equal(got, want)
            elif isinstance(want, float) and math.isnan(want):
                ok = isinstance(got, float) and math.isnan(got)
            else:
                ok = type(got) is type(want) and got == want
            if not ok:
                fail(f"broadcast_object from {root}: object {i} arrived as {got!r:.80}")
        # by default no code from the wire: a custom class is refused, saying how to opt in, and a payload
        # whose unpickling would run a command runs nothing
        if r == root:
            bps.broadcast_object(Custom(r), root_rank=root, name=f"nopickle{root}")
        else:
            expect_raises(bps.BroadcastError, "allow_pickle",
                          lambda: bps.broadcast_object(None, root_rank=root, name=f"nopickle{root}"),
                          "a pickle-only object without allow_pickle")
        marker = f"/tmp/pushpull-exploit-{os.getppid()}-{root}"  # the launcher is every worker's parent
        if r == root:
            bps.broadcast_object(Exploit(marker), root_rank=root, name=f"exploit{root}")
        else:
            expect_raises(bps.BroadcastError, "allow_pickle",
                          lambda: bps.broadcast_object(None, root_rank=root, name=f"exploit{root}"),
                          "a pickle payload that runs a command")
            if os.path.exists(marker):
                fail("a broadcast pickle payload ran a command on a receiving rank")
    expect_raises(ValueError, "root_rank", lambda: bps.broadcast_parameters({}, root_rank=n), "bad root")
    if distributed():
        # a rank with a different parameter set: every rank raises, nobody hangs
        ts = {"a": torch.ones(3), "b": torch.ones(2)}
        if r == n - 1:
            ts["extra"] = torch.ones(1)
        expect_raises(bps.BroadcastError, f"[{n - 1}]",
                      lambda: bps.broadcast_parameters(ts, 0, prefix="bcbad."), "different parameter sets")


# ------------------------------------------------------------------ optimizer state --

def opt_state_equal(what: str, got: torch.optim.Optimizer, want: dict) -> None:
    g = got.state_dict()
    gg = [{k: v for k, v in pg.items()} for pg in g["param_groups"]]
    wg = [{k: v for k, v in pg.items()} for pg in want["param_groups"]]
    if gg != wg:
        fail(f"{what}: param_groups {gg} != {wg}")
    if sorted(g["state"]) != sorted(want["state"]):
        fail(f"{what}: state has parameters {sorted(g['state'])}, want {sorted(want['state'])}")
    for idx, st in want["state"].items():
        if sorted(g["state"][idx]) != sorted(st):
            fail(f"{what}: state[{idx}] keys {sorted(g['state'][idx])} != {sorted(st)}")
        for k, v in st.items():
            o = g["state"][idx][k]
            if isinstance(v, torch.Tensor):
                expect_bits(f"{what}: state[{idx}][{k!r}]", o, v)
            elif o != v or type(o) is not type(v):
                fail(f"{what}: state[{idx}][{k!r}] = {o!r}, want {v!r}")


def build_opt(kind: str, model: nn.Module, rank: int) -> torch.optim.Optimizer:
    lr = 0.01 * (rank + 1)  # hyperparameters differ too: the root's win
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.8, 0.99 - 0.001 * rank), amsgrad=True)
    raise ValueError(kind)


def stepped(kind: str, rank: int, steps: int, custom: bool = False):
    """A model and optimizer that took ``steps`` steps on rank-dependent data."""
    model = make_model(7)
    opt = build_opt(kind, model, rank)
    for s in range(steps):
        x, y = batch(rank, s, 4)
        opt.zero_grad()
        LOSS(model(x), y).backward()
        opt.step()
    if custom and steps:
        p = next(model.parameters())
        opt.state[p]["note"] = f"from rank {rank}"   # non-tensor entries travel as values
        opt.state[p]["count"] = rank + 10
        opt.state[p]["seen"] = (rank, [1.5, None])
    return model, opt


def case_optstate() -> None:
    r, n = bps.rank(), bps.size()
    for kind in ("sgd", "adam"):
        for root in range(n):
            # (root steps, other ranks' steps): non-empty everywhere, empty on the others, empty on the root
            for root_steps, other_steps in ((2, 3), (2, 0), (0, 2)):
                steps = root_steps if r == root else other_steps
                model, opt = stepped(kind, r, steps, custom=True)
                mine = copy.deepcopy(opt.state_dict())
                bps.broadcast_optimizer_state(opt, root_rank=root)
                _, ref_opt = stepped(kind, root, root_steps, custom=True)
                what = f"{kind} from root {root} ({root_steps}/{other_steps} steps)"
                opt_state_equal(what, opt, ref_opt.state_dict())
                if r == root:
                    opt_state_equal(what + " (root unchanged)", opt, mine)
                # the state round-trips: the same data from here on gives the same parameters everywhere
                bps.broadcast_parameters(model.state_dict(), root, prefix=f"os.{kind}.")
                ref_model, ref_opt = stepped(kind, root, root_steps, custom=True)
                for m, o in ((model, opt), (ref_model, ref_opt)):
                    for s in range(2):
                        x, y = batch(99, s, 4)
                        o.zero_grad()
                        LOSS(m(x), y).backward()
                        o.step()
                for (k, a), (_, b) in zip(model.named_parameters(), ref_model.named_parameters()):
                    expect_bits(f"{what}: {k} after two more steps", a.detach(), b.detach())
    if distributed():
        model, opt = stepped("sgd", r, 1)
        if r == n - 1:
            opt = torch.optim.SGD(list(model.parameters())[:2], lr=0.1, momentum=0.9)
        expect_raises(bps.BroadcastError, f"[{n - 1}]", lambda: bps.broadcast_optimizer_state(opt, 0),
                      "optimizer with a different layout")


# ------------------------------------------------------------------ gradients --

def case_grads() -> None:
    """After synchronize(), every gradient is the average of the workers' gradients."""
    r, n = bps.rank(), bps.size()
    model = worker_model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named("g", model))
    for step in range(3):
        opt.zero_grad()
        x, y = batch(r, step, 5)
        LOSS(model(x), y).backward()
        opt.synchronize()
        want = [torch.zeros_like(p) for p in model.parameters()]
        for k in range(n):
            m = copy.deepcopy(model)
            m.zero_grad()
            LOSS(m(*batch(k, step, 5)[:1]), batch(k, step, 5)[1]).backward()
            for w, p in zip(want, m.parameters()):
                w += p.grad / n
        for (name, p), w in zip(model.named_parameters(), want):
            if not torch.allclose(p.grad, w, rtol=1e-5, atol=1e-7):
                fail(f"step {step}: gradient of {name} is not the average over workers "
                     f"(max diff {(p.grad - w).abs().max().item():.3g})")
        with opt.skip_synchronize():
            opt.step()


# ------------------------------------------------------------------ equivalence --

def case_equiv() -> None:
    """N workers x batch b == one process x batch N*b, also with two backward passes per step."""
    r = bps.rank()
    steps, b = 5, 8
    ref = reference(steps, b)
    for passes in (1, 2):
        model = worker_model()
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=named(f"eq{passes}", model), model=model,
                                       backward_passes_per_step=passes)
        for step in range(steps):
            x, y = batch(r, step, b)
            opt.zero_grad()
            for xm, ym in zip(x.chunk(passes), y.chunk(passes)):
                # gradients are summed over passes and averaged over workers: scale by 1/passes
                (LOSS(model(xm), ym) / passes).backward()
            opt.step()
        expect_close(f"DistributedOptimizer, backward_passes_per_step={passes}", model, ref)


def case_ddp() -> None:
    """The DistributedDataParallel wrapper (with and without no_sync) matches the reference."""
    r = bps.rank()
    steps, b = 5, 8
    ref = reference(steps, b)
    for accumulate in (False, True):
        model = bps.DistributedDataParallel(make_model(r + 1), name=f"ddp{int(accumulate)}")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            x, y = batch(r, step, b)
            opt.zero_grad()
            if accumulate:
                with model.no_sync():  # nothing is averaged here: the gradients accumulate locally
                    (LOSS(model(x[: b // 2]), y[: b // 2]) / 2).backward()
                (LOSS(model(x[b // 2:]), y[b // 2:]) / 2).backward()
            else:
                LOSS(model(x), y).backward()
            opt.step()
        expect_close(f"DistributedDataParallel (no_sync={accumulate})", model.module, ref)
    # buffers: set from the root at construction, and again before every training forward
    net = nn.BatchNorm1d(D_IN)
    net.running_mean.fill_(float(r))
    wrapped = bps.DistributedDataParallel(net, name="ddpbn")
    if not torch.equal(net.running_mean, torch.zeros(D_IN)):
        fail(f"BatchNorm running_mean not taken from rank 0 at construction: {net.running_mean.tolist()}")
    net.running_var.fill_(float(r + 5))
    x = torch.randn(4, D_IN, generator=torch.Generator().manual_seed(5))
    wrapped(x)
    ref_bn = nn.BatchNorm1d(D_IN)
    ref_bn.running_var.fill_(5.0)
    ref_bn(x)
    for k in ("running_mean", "running_var", "num_batches_tracked"):
        expect_bits(f"BatchNorm {k} after a training forward", getattr(net, k), getattr(ref_bn, k))


def case_ddp_hook() -> None:
    """PyTorch's own DDP with pushpull's comm hook matches the reference."""
    import torch.distributed as dist

    r = bps.rank()
    steps, b = 5, 8
    ref = reference(steps, b)
    bps.init_process_group_for_ddp()
    try:
        model = make_model(r + 1)  # torch's DDP broadcasts rank 0's parameters itself
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0002)
        ddp.register_comm_hook(bps.CommHookState("hook"), bps.ddp_comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            x, y = batch(r, step, b)
            opt.zero_grad()
            LOSS(ddp(x), y).backward()
            opt.step()
        expect_close("torch DDP with ddp_comm_hook", model, ref)
        if distributed():
            used = [k for k in bps.engine().table.entries if k.startswith("Gradient.hook.bucket")]
            if len(used) < 2:
                fail(f"expected several DDP buckets through the parameter servers, saw {used}")
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ GradScaler --

def case_scaler() -> None:
    """scale -> backward -> synchronize -> unscale_ -> clip -> step in skip_synchronize -> update;
    an inf on one rank makes every rank skip the step and lower the scale."""
    r, n = bps.rank(), bps.size()
    steps, b, bad_step = 5, 8, 2
    model = worker_model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=named("amp", model), model=model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    ref = make_model(1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(r, step, b)
        if step == bad_step and r == n - 1:
            x[0, 0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        scaler.scale(LOSS(model(x), y)).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        if step == bad_step:
            for (k, p), q in zip(model.named_parameters(), before):
                expect_bits(f"step with inf on rank {n - 1}: {k} must not change", p.detach(), q)
            continue
        xg, yg = global_batch(step, b)
        ref_opt.zero_grad()
        LOSS(ref(xg), yg).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5)
        ref_opt.step()
    expect_close("GradScaler pattern", model, ref)
    # 256 -> (2 good steps) 512 -> (inf) 256 -> (2 good steps) 512
    if scaler.get_scale() != 512.0:
        fail(f"GradScaler scale is {scaler.get_scale()}, want 512.0")


# ------------------------------------------------------------------ guard rails --

def case_guards() -> None:
    r = bps.rank()
    model = make_model(3)
    expect_raises(ValueError, "'w'", lambda: bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=[("w", p) for p in model.parameters()]),
        "duplicate parameter names")
    expect_raises(ValueError, "backward_passes_per_step", lambda: bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=0), "backward_passes_per_step=0")
    if not distributed():
        return  # the remaining guards watch the autograd hooks, which only exist when distributed
    model = worker_model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named("gd", model),
                                   backward_passes_per_step=2)
    x, y = batch(r, 0, 4)

    def backward():
        LOSS(model(x), y).backward()

    backward()
    backward()  # two passes are allowed
    expect_raises(RuntimeError, "backward_passes_per_step=2", backward, "a third backward pass before step()")
    opt.synchronize()  # drains the reductions in flight
    opt.step()
    opt.zero_grad()
    backward()
    backward()
    expect_raises(RuntimeError, "zero_grad()", opt.zero_grad, "zero_grad between backward and step")
    opt.step()
    opt.zero_grad()  # fine after step
    # skip_synchronize without synchronize: the gradients were never reduced
    backward()
    backward()

    def bad_step():
        with opt.skip_synchronize():
            opt.step()
    expect_raises(RuntimeError, "synchronize()", bad_step, "step in skip_synchronize without synchronize")
    opt.synchronize()
    opt.step()


# ------------------------------------------------------------------ unused parameters --

class Branchy(nn.Module):
    """A trunk used everywhere and a branch used only on rank 0."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = nn.Linear(D_IN, D_OUT)
        self.branch = nn.Linear(D_IN, D_OUT)

    def forward(self, x, use_branch: bool):
        out = self.trunk(x)
        return out + self.branch(x) if use_branch else out


def case_unused() -> None:
    r, n = bps.rank(), bps.size()
    steps, b = 4, 6
    ref = Branchy(1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        ref_opt.zero_grad()
        # the global loss is the mean of the workers' losses, each with its own forward
        sum(LOSS(ref(*batch(k, step, b)[:1], k == 0), batch(k, step, b)[1]) for k in range(n)).div(n).backward()
        ref_opt.step()
    for wrapper in ("optimizer", "ddp"):
        model = Branchy(r + 1)
        if wrapper == "optimizer":
            bps.broadcast_parameters(model.state_dict(), 0)
            opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                           named_parameters=named("un", model), model=model)
            fwd = model
        else:
            fwd = bps.DistributedDataParallel(model, name="unddp")
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            x, y = batch(r, step, b)
            opt.zero_grad()
            LOSS(fwd(x, r == 0), y).backward()
            opt.step()
        expect_close(f"branch used on rank 0 only ({wrapper})", model, ref)


CASES = {
    "broadcast": case_broadcast, "optstate": case_optstate, "grads": case_grads, "equiv": case_equiv,
    "ddp": case_ddp, "ddp_hook": case_ddp_hook, "scaler": case_scaler, "guards": case_guards,
    "unused": case_unused,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", choices=list(CASES) + ["all"])
    args = p.parse_args()
    torch.set_num_threads(1)  # several workers share this machine's cores
    bps.init()
    cases = list(CASES) if "all" in args.cases else args.cases
    run_cases(CASES, cases, bps.rank(), bps.size(), bps.shutdown)


if __name__ == "__main__":
    main()
