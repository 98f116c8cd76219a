"""Worker program for tests/cluster/test_collectives.py: Horovod's torch collectives over the parameter servers,
each against a plain-torch reference, run under ``pushpull launch`` (or alone).

Inputs are deterministic functions of (case, rank), so every rank rebuilds every rank's input and computes
the expected result itself. Every case prints ``CASE <name> ok`` or ``CASE <name> FAIL <why>`` and the
program goes on with the next case (a timeout bounds a case that hangs), so the test reports one result per
case, as Horovod's test suite does.
"""
from __future__ import annotations

import copy
import sys
import time
import traceback

import torch
from torch import nn

import pushpull.torch as hvd

REDUCIBLE = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
             torch.int64, torch.uint8]
MOVABLE = REDUCIBLE + [torch.bool, torch.complex64]  # allgather, alltoall and broadcast move bits
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-6, torch.float64: 1e-12}
ERROR_WITHIN_S = 10.0  # a disagreement must reach every rank this fast


class CaseFailed(AssertionError):
    pass


def dt(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def data(seed: int, rank: int, dtype: torch.dtype, shape) -> torch.Tensor:
    """Rank- and case-dependent values small enough that a product of 3 fits in int8."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) * 2 + 0.5).to(dtype) * torch.where(
            torch.rand(shape, generator=g) > 0.5, 1, -1).to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=g).to(dtype)


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        raise CaseFailed(f"{what}: got {getattr(got, 'dtype', type(got))}{list(getattr(got, 'shape', []))}, "
                         f"want {want.dtype}{list(want.shape)}")
    if want.dtype in TOL:
        ok = torch.allclose(got.double(), want.double(), rtol=TOL[want.dtype], atol=TOL[want.dtype])
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise CaseFailed(f"{what}: got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")


def reference(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    """What the servers compute: half precisions accumulate in float32 and round once; integer averages
    truncate toward zero."""
    dtype = xs[0].dtype
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = xs[0].to(wide).clone()
    for x in xs[1:]:
        x = x.to(wide)
        if op in ("Sum", "Average"):
            acc = acc + x
        elif op == "Min":
            acc = torch.minimum(acc, x)
        elif op == "Max":
            acc = torch.maximum(acc, x)
        else:
            acc = acc * x
    acc = acc.to(dtype)
    if op == "Average":
        n = len(xs)
        acc = acc / n if dtype.is_floating_point else torch.div(acc, n, rounding_mode="trunc")
    return acc.to(dtype)


def everyone(seed: int, dtype, shape_of) -> list[torch.Tensor]:
    return [data(seed, k, dtype, shape_of(k)) for k in range(hvd.size())]


def raises(fn, exc, *needles) -> str:
    t0 = time.monotonic()
    try:
        fn()
    except exc as e:
        took = time.monotonic() - t0
        text = str(e)
        missing = [n for n in needles if n not in text]
        if missing:
            raise CaseFailed(f"the error does not mention {missing}: {text}")
        if took > ERROR_WITHIN_S:
            raise CaseFailed(f"the error came after {took:.1f}s (> {ERROR_WITHIN_S}s): {text}")
        return text
    raise CaseFailed(f"no {exc.__name__} raised")


CASES: dict = {}
NEEDS_PEERS: set = set()  # cases about several workers disagreeing: skipped when alone


def case(name, peers: bool = False):
    def deco(fn):
        CASES[name] = fn
        if peers:
            NEEDS_PEERS.add(name)
        return fn
    return deco


# ------------------------------------------------------------------ allreduce --

def _allreduce_case(op: str, dtype: torch.dtype, seed: int):
    def run():
        xs = everyone(seed, dtype, lambda k: (5, 3))
        got = hvd.allreduce(xs[hvd.rank()], op=OPS[op], name=f"ar.{op}.{dt(dtype)}")
        check(f"allreduce op={op}", got, reference(xs, op))
    return run


for _i, _op in enumerate(OPS):
    for _j, _d in enumerate(REDUCIBLE):
        CASES[f"allreduce-{_op}-{dt(_d)}"] = _allreduce_case(_op, _d, 10 * _i + _j)


@case("allreduce-variants")
def _():
    r = hvd.rank()
    xs = everyone(1, torch.float32, lambda k: (4,))
    want = reference(xs, "Average")
    t = xs[r].clone()
    check("allreduce_", hvd.allreduce_(t, name="v.inplace"), want)
    check("allreduce_ wrote in place", t, want)
    check("allreduce_async", hvd.synchronize(hvd.allreduce_async(xs[r], name="v.async", op=hvd.Sum)),
          reference(xs, "Sum"))
    t = xs[r].clone()
    h = hvd.allreduce_async_(t, name="v.async_", op=hvd.Max)
    hvd.synchronize(h)
    check("allreduce_async_", t, reference(xs, "Max"))
    check("average=False (deprecated form)", hvd.allreduce(xs[r], average=False, name="v.avgflag"),
          reference(xs, "Sum"))
    check("unnamed", hvd.allreduce(xs[r]), want)
    check("push_pull", hvd.push_pull(xs[r], average=True, name="v.pp"), want)


@case("allreduce-scale-factors")
def _():
    r = hvd.rank()
    for dtype in (torch.float32, torch.float64, torch.int32):
        xs = everyone(2, dtype, lambda k: (6,))
        for op in ("Sum", "Average"):
            got = hvd.allreduce(xs[r], op=OPS[op], prescale_factor=2.0, postscale_factor=0.5,
                                name=f"scale.{op}.{dt(dtype)}")
            scaled = [(x.double() * 2.0).to(dtype) if not dtype.is_floating_point else x * 2.0 for x in xs]
            want = reference(scaled, op)
            want = want * 0.5 if dtype.is_floating_point else (want.double() * 0.5).to(dtype)
            check(f"prescale 2, postscale 0.5, {op}, {dt(dtype)}", got, want)


@case("allreduce-direct-path")
def _():
    """Small blocking calls go on the caller's thread once the key is ready, and stay correct."""
    r = hvd.rank()
    before = hvd.engine().stats["direct_calls"] if hvd.engine() else 0
    for i in range(4):
        xs = everyone(30 + i, torch.float32, lambda k: (3,))
        check("direct", hvd.allreduce(xs[r], name="direct.x", op=hvd.Sum), reference(xs, "Sum"))
    if hvd.engine() is not None and hvd.engine().stats["direct_calls"] - before < 3:
        raise CaseFailed("the direct path was not used for small blocking allreduces")


@case("grouped_allreduce")
def _():
    r = hvd.rank()
    groups = [everyone(40 + i, d, lambda k: (3, i + 1)) for i, d in enumerate(REDUCIBLE)]
    got = hvd.grouped_allreduce([g[r] for g in groups], op=hvd.Sum, name="grp")
    for g, out in zip(groups, got):
        check(f"grouped {dt(g[0].dtype)}", out, reference(g, "Sum"))
    ts = [g[r].clone() for g in groups[2:4]]
    hvd.synchronize(hvd.grouped_allreduce_async_(ts, name="grp_"))
    for g, out in zip(groups[2:4], ts):
        check("grouped in place", out, reference(g, "Average"))
    outs = hvd.synchronize(hvd.grouped_allreduce_async([g[r] for g in groups[:2]], op=hvd.Max, name="grpa"))
    for g, out in zip(groups[:2], outs):
        check("grouped async", out, reference(g, "Max"))


# ------------------------------------------------------------------ allgather --

def _allgather_case(dtype: torch.dtype, seed: int):
    def run():
        xs = everyone(seed, dtype, lambda k: (k + 1, 2, 3))  # first dimensions differ
        check("allgather", hvd.allgather(xs[hvd.rank()], name=f"ag.{dt(dtype)}"), torch.cat(xs))
    return run


for _j, _d in enumerate(MOVABLE):
    CASES[f"allgather-{dt(_d)}"] = _allgather_case(_d, 100 + _j)


@case("allgather-variants")
def _():
    r, n = hvd.rank(), hvd.size()
    xs = everyone(120, torch.float32, lambda k: (k % 2, 4))  # some ranks give no rows
    check("empty rows", hvd.allgather(xs[r], name="ag.empty"), torch.cat(xs))
    check("scalar", hvd.allgather(torch.tensor(float(r)), name="ag.scalar"), torch.arange(n, dtype=torch.float32))
    big = everyone(121, torch.float32, lambda k: (40_000 + k, 3))  # several partitions
    check("several partitions", hvd.synchronize(hvd.allgather_async(big[r], name="ag.big")), torch.cat(big))
    for i in range(3):  # sizes that change from call to call, same name
        xs = everyone(130 + i, torch.int64, lambda k: (k + i, 2))
        check(f"call {i}", hvd.allgather(xs[r], name="ag.vary"), torch.cat(xs))
    objs = [{"rank": k, "v": [k] * k} for k in range(n)]
    got = hvd.allgather_object(objs[r], name="ago")
    if got != objs:
        raise CaseFailed(f"allgather_object: {got} != {objs}")
    if hvd.allgather_object(("t", r)) != [("t", k) for k in range(n)]:
        raise CaseFailed("allgather_object of tuples (torch.save) differs")


# ------------------------------------------------------------------ alltoall --

def _alltoall_case(dtype: torch.dtype, seed: int):
    def run():
        r, n = hvd.rank(), hvd.size()
        splits = [[(src + dst) % 3 for dst in range(n)] for src in range(n)]  # some zero
        xs = [data(seed, k, dtype, (sum(splits[k]) + 1, 2)) for k in range(n)]  # one row left over
        out, received = hvd.alltoall(xs[r], splits=torch.tensor(splits[r], dtype=torch.int32),
                                     name=f"a2a.{dt(dtype)}")
        parts = []
        for src in range(n):
            start = sum(splits[src][:r])
            parts.append(xs[src][start:start + splits[src][r]])
        check("alltoall", out, torch.cat(parts))
        check("received splits", received, torch.tensor([splits[src][r] for src in range(n)], dtype=torch.int32))
    return run


for _j, _d in enumerate(MOVABLE):
    CASES[f"alltoall-{dt(_d)}"] = _alltoall_case(_d, 200 + _j)


@case("alltoall-variants")
def _():
    r, n = hvd.rank(), hvd.size()
    xs = everyone(220, torch.float32, lambda k: (2 * n, 3))
    out = hvd.alltoall(xs[r], name="a2a.even")
    check("without splits", out, torch.cat([xs[src][2 * r:2 * r + 2] for src in range(n)]))
    out, received = hvd.synchronize(hvd.alltoall_async(xs[r], splits=[2 * n] + [0] * (n - 1), name="a2a.one"))
    want = torch.cat(xs) if r == 0 else torch.zeros((0, 3))
    check("everything to rank 0", out, want)


# ------------------------------------------------------------------ reducescatter --

def _reducescatter_case(op: str, dtype: torch.dtype, seed: int):
    def run():
        r, n = hvd.rank(), hvd.size()
        dim0 = 2 * n + 1  # uneven: the first rank gets one row more
        xs = everyone(seed, dtype, lambda k: (dim0, 2))
        full = reference(xs, op)
        rows = [dim0 // n + (1 if j < dim0 % n else 0) for j in range(n)]
        start = sum(rows[:r])
        got = hvd.reducescatter(xs[r], op=OPS[op], name=f"rs.{op}.{dt(dtype)}")
        check(f"reducescatter op={op}", got, full[start:start + rows[r]])
    return run


for _i, _op in enumerate(("Sum", "Average")):
    for _j, _d in enumerate(REDUCIBLE):
        CASES[f"reducescatter-{_op}-{dt(_d)}"] = _reducescatter_case(_op, _d, 300 + 10 * _i + _j)
for _op in ("Min", "Max", "Product"):
    CASES[f"reducescatter-{_op}-float32"] = _reducescatter_case(_op, torch.float32, 330 + len(_op))



@case("reducescatter-unnamed")
def _():
    r, n = hvd.rank(), hvd.size()
    xs = everyone(340, torch.float32, lambda k: (2 * n, 3))
    full = reference(xs, "Sum")
    for _ in range(2):  # the second call reuses the first's key (unnamed calls of one signature)
        check("unnamed reducescatter", hvd.reducescatter(xs[r], op=hvd.Sum), full[2 * r:2 * r + 2])


# ------------------------------------------------------------------ futures --

@case("get-future-then")
def _():
    r = hvd.rank()
    xs = everyone(350, torch.float32, lambda k: (5,))
    fut = hvd.get_future(hvd.allreduce_async(xs[r], op=hvd.Sum, name="fut.sum"))
    doubled = fut.then(lambda f: f.value() * 2)
    check("get_future(...).then", doubled.wait(), reference(xs, "Sum") * 2)
    check("the future's own value", fut.value(), reference(xs, "Sum"))
    grouped = hvd.get_future(hvd.grouped_allreduce_async([xs[r], xs[r] + 1], op=hvd.Sum, name="fut.group"))
    got = grouped.wait()
    check("get_future of a grouped allreduce", got[1], reference([x + 1 for x in xs], "Sum"))


@case("get-future-consumes-handle")
def _():
    h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="fut.consumed")
    hvd.get_future(h).wait()
    raises(lambda: hvd.synchronize(h), ValueError, "unknown handle", "already synchronized")


@case("get-future-timeout", peers=True)
def _():
    # rank 0 starts a reduction the others join only 3 s later: its future, with a 1 s deadline, fails first,
    # naming the ranks it waits for; then the round completes and frees the handle
    if hvd.rank() == 0:
        fut = hvd.get_future(hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="fut.late"), timeout=1.0)
        t0 = time.monotonic()
        try:
            fut.wait()
        except Exception as e:  # noqa: BLE001 - torch re-raises the future's exception as it was set
            text, took = str(e), time.monotonic() - t0
            if "did not finish within 1s" not in text or "fut.late" not in text or took > 3.0:
                raise CaseFailed(f"after {took:.1f}s: {text}") from None
        else:
            raise CaseFailed("the late future completed instead of timing out")
    else:
        time.sleep(3.0)
        hvd.allreduce(torch.ones(2), op=hvd.Sum, name="fut.late")


# ------------------------------------------------------------------ broadcast --

def _broadcast_case(dtype: torch.dtype, seed: int):
    def run():
        r, n = hvd.rank(), hvd.size()
        for root in range(n):
            xs = everyone(seed + root, dtype, lambda k: (3, 4))
            t = xs[r].clone()
            check(f"broadcast from {root}", hvd.broadcast(t, root, name=f"bc.{dt(dtype)}.{root}"), xs[root])
            check("input untouched", t, xs[r])
            out = hvd.synchronize(hvd.broadcast_async_(t, root, name=f"bca.{dt(dtype)}.{root}"))
            if out is not t:
                raise CaseFailed("broadcast_async_ must return the tensor it was given")
            check(f"broadcast_async_ from {root}", t, xs[root])
    return run


for _j, _d in enumerate(MOVABLE):
    CASES[f"broadcast-{dt(_d)}"] = _broadcast_case(_d, 400 + 10 * _j)


# ------------------------------------------------------------------ autograd --

@case("grad-allreduce")
def _():
    r, n = hvd.rank(), hvd.size()
    for op in ("Sum", "Average"):
        x = data(500, r, torch.float64, (4,)).requires_grad_()
        w = data(501, r, torch.float64, (4,))
        (hvd.allreduce(x, op=OPS[op], name=f"g.ar.{op}") * w).sum().backward()
        ws = everyone(501, torch.float64, lambda k: (4,))
        check(f"grad of allreduce({op})", x.grad, reference(ws, op))
    x = data(502, r, torch.float64, (4,)).requires_grad_()
    (hvd.allreduce(x, op=hvd.Max, name="g.ar.max") * 1.0).sum().backward()
    xs = everyone(502, torch.float64, lambda k: (4,))
    want = (xs[r] == torch.stack(xs).max(0).values).double() * n
    check("grad of allreduce(Max)", x.grad, want)


@case("grad-allgather")
def _():
    r, n = hvd.rank(), hvd.size()
    x = data(510, r, torch.float64, (r + 1, 2)).requires_grad_()
    w = data(511, r, torch.float64, (n * (n + 1) // 2, 2))
    (hvd.allgather(x, name="g.ag") * w).sum().backward()
    ws = everyone(511, torch.float64, lambda k: (n * (n + 1) // 2, 2))
    start = r * (r + 1) // 2
    check("grad of allgather (averaged, as Horovod)", x.grad, (sum(ws) / n)[start:start + r + 1])


@case("grad-broadcast")
def _():
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    x = data(520, r, torch.float64, (3,)).requires_grad_()
    w = data(521, r, torch.float64, (3,))
    (hvd.broadcast(x, root, name="g.bc") * w).sum().backward()
    ws = everyone(521, torch.float64, lambda k: (3,))
    check("grad of broadcast", x.grad, sum(ws) if r == root else torch.zeros(3, dtype=torch.float64))


@case("grad-alltoall-reducescatter-grouped")
def _():
    r, n = hvd.rank(), hvd.size()
    x = data(530, r, torch.float64, (2 * n, 2)).requires_grad_()
    out = hvd.alltoall(x, name="g.a2a")
    w = data(531, r, torch.float64, tuple(out.shape))
    (out * w).sum().backward()
    ws = everyone(531, torch.float64, lambda k: (2 * n, 2))
    check("grad of alltoall", x.grad, torch.cat([ws[dst][2 * r:2 * r + 2] for dst in range(n)]))
    x = data(532, r, torch.float64, (n, 2)).requires_grad_()
    out = hvd.reducescatter(x, op=hvd.Sum, name="g.rs")
    w = data(533, r, torch.float64, (1, 2))
    (out * w).sum().backward()
    check("grad of reducescatter (Sum: size x, as Horovod)", x.grad,
          torch.cat(everyone(533, torch.float64, lambda k: (1, 2))) * n)
    a, b = data(534, r, torch.float64, (2,)).requires_grad_(), data(535, r, torch.float64, (3,)).requires_grad_()
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum, name="g.grp")
    (ya.sum() * 2 + yb.sum()).backward()
    check("grad of grouped_allreduce", a.grad, torch.full((2,), 2.0 * n, dtype=torch.float64))
    check("grad of grouped_allreduce", b.grad, torch.full((3,), float(n), dtype=torch.float64))


@case("sync-batch-norm")
def _():
    r = hvd.rank()
    torch.manual_seed(7)
    ref = nn.BatchNorm1d(3).double()
    sync = hvd.SyncBatchNorm(3).double()
    sync.load_state_dict(ref.state_dict())
    xs = everyone(540, torch.float64, lambda k: (k + 2, 3, 4))
    ws = everyone(541, torch.float64, lambda k: (k + 2, 3, 4))
    x = xs[r].clone().requires_grad_()
    y = sync(x)
    (y * ws[r]).sum().backward()
    xg = torch.cat(xs).requires_grad_()
    out = ref(xg)
    (out * torch.cat(ws)).sum().backward()
    start = sum(k + 2 for k in range(r))
    check("SyncBatchNorm output", y.detach(), out[start:start + r + 2].detach())
    check("SyncBatchNorm input gradient", x.grad, xg.grad[start:start + r + 2])
    check("SyncBatchNorm running_mean", sync.running_mean, ref.running_mean)
    check("SyncBatchNorm running_var", sync.running_var, ref.running_var)
    check("SyncBatchNorm weight gradient (summed)", hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="g.bn.w"),
          ref.weight.grad)
    sync.eval()
    check("SyncBatchNorm eval", sync(xs[r]).detach(), ref.eval()(xs[r]).detach())


# ------------------------------------------------------------------ name spaces --

@case("names-unnamed-optimizer-and-push-pull")
def _():
    """The issue's collision: an unnamed DistributedOptimizer's gradients and unnamed push_pull calls."""
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(3)
    model = nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for i in range(3):
        got = hvd.push_pull(torch.arange(6, dtype=torch.int32) * (r + 1), average=False)  # int32, unnamed
        check("unnamed int32 push_pull", got, torch.arange(6, dtype=torch.int32) * (n * (n + 1) // 2))
    opt.zero_grad()
    model(data(600, r, torch.float32, (4, 3))).sum().backward()
    opt.step()


@case("names-broadcast-vs-gradient")
def _():
    """A broadcast named like a parameter does not share the gradient's key."""
    r = hvd.rank()
    model = nn.Sequential(nn.Linear(3, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast(torch.ones(7), 0, name="0.bias")  # another shape than the gradient 0.bias
    hvd.allreduce(torch.ones(5), name="0.bias")
    opt.zero_grad()
    model(data(610, r, torch.float32, (4, 3))).sum().backward()
    opt.step()
    eng = hvd.engine()
    if eng is not None:
        names = set(eng.table.entries)
        for k in ("Gradient.0.bias", "broadcast.0.bias", "allreduce.0.bias"):
            if k not in names:
                raise CaseFailed(f"{k!r} not among the keys: {sorted(names)[:20]}")


@case("names-push-pull-is-allreduce")
def _():
    """BytePS's push_pull(name=x) and Horovod's allreduce(name=x) are the same user reduction."""
    r = hvd.rank()
    a = hvd.push_pull(torch.ones(2) * r, average=False, name="shared")
    b = hvd.allreduce(torch.ones(2) * r, op=hvd.Sum, name="shared")
    check("same key", a, b)
    hvd.declare("shared")
    if hvd.engine() is not None and "allreduce.shared" not in hvd.engine().table.entries:
        raise CaseFailed("push_pull(name='shared') is not allreduce.shared on the servers")


@case("names-unnamed-calls-reuse-their-keys")
def _():
    """Unnamed calls are numbered by what they move and by which earlier ones are not synchronized yet: a
    per-batch metric average keeps one key, and concurrent ones get their own."""
    r, n = hvd.rank(), hvd.size()
    eng = hvd.engine()

    def data_keys():  # an unnamed key's first use also declares a small agreement key (noname.agree.<i>)
        return len([k for k in eng.table.entries if not k.startswith("noname.agree.")]) if eng else 0
    before = data_keys()
    for i in range(20):
        check("metric average", hvd.allreduce(torch.tensor([float(r + i)])), torch.tensor([(n - 1) / 2 + i]))
    if eng is not None and data_keys() - before > 1:
        raise CaseFailed(f"20 unnamed blocking allreduces declared {data_keys() - before} keys")
    hs = [hvd.allreduce_async(torch.full((2,), float(r * 10 + k)), op=hvd.Sum) for k in range(3)]
    for k, h in enumerate(hs):
        check(f"concurrent unnamed {k}", hvd.synchronize(h), torch.full((2,), float(10 * n * (n - 1) // 2 + n * k)))
    if eng is not None:
        names = sorted(k for k in eng.table.entries if k.startswith("allreduce.noname.float32[2]"))
        if names != [f"allreduce.noname.float32[2].{k}" for k in range(3)]:
            raise CaseFailed(f"concurrent unnamed calls: {names}")


# ------------------------------------------------------------------ agreement checks --

@case("error-broadcast-dtype", peers=True)
def _():
    r = hvd.rank()
    t = torch.arange(4, dtype=torch.int32 if r == 1 else torch.float32)
    raises(lambda: hvd.broadcast(t, 0, name="e.dtype"), hvd.PushPullError, "broadcast.e.dtype", "dtype",
           "[1] gave int32", "float32")


@case("error-broadcast-root", peers=True)
def _():
    r, n = hvd.rank(), hvd.size()
    raises(lambda: hvd.broadcast(torch.ones(3), 0 if r else n - 1, name="e.root"), hvd.PushPullError,
           "broadcast.e.root", "root_rank", f"rank(s) [0] gave {n - 1}")


@case("error-broadcast-shape", peers=True)
def _():
    r = hvd.rank()
    raises(lambda: hvd.broadcast(torch.ones(3 + (r == 1)), 0, name="e.shape"), hvd.PushPullError,
           "broadcast.e.shape", "rank 1", "[4]")


@case("error-allreduce-op", peers=True)
def _():
    r = hvd.rank()
    raises(lambda: hvd.allreduce(torch.ones(3), op=hvd.Max if r == 1 else hvd.Sum, name="e.op"),
           hvd.PushPullError, "allreduce.e.op", "op=max", "op=sum", "rank(s) [1]")


@case("error-allreduce-average", peers=True)
def _():
    r = hvd.rank()
    raises(lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if r == 1 else hvd.Average, name="e.avg"),
           hvd.PushPullError, "allreduce.e.avg", "average", "rank(s) [1] gave False")
    hvd.allreduce(torch.ones(3), name="e.avg2")  # ready: the next call may take the direct path
    raises(lambda: hvd.push_pull(torch.ones(3), average=r != 1, name="e.avg2"), hvd.PushPullError,
           "allreduce.e.avg2", "average", "rank(s) [1] gave False")


@case("error-allreduce-dtype", peers=True)
def _():
    r = hvd.rank()
    raises(lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32 if r == 1 else torch.float32), name="e.dt"),
           hvd.PushPullError, "allreduce.e.dt", "int32", "float32", "rank 1")


@case("error-allreduce-scale", peers=True)
def _():
    r = hvd.rank()
    raises(lambda: hvd.allreduce(torch.ones(3), prescale_factor=2.0 if r == 1 else 1.0, name="e.scale"),
           hvd.PushPullError, "allreduce.e.scale", "prescale_factor/postscale_factor", "rank(s) [1]")


@case("error-allgather-shape", peers=True)
def _():
    r = hvd.rank()
    raises(lambda: hvd.allgather(torch.ones(2, 3 + (r == 1)), name="e.ag"), hvd.PushPullError,
           "allgather.e.ag", "rank(s) [1] gave float32 [*, 4]", "float32 [*, 3]")


@case("error-alltoall-dtype", peers=True)
def _():
    r, n = hvd.rank(), hvd.size()
    raises(lambda: hvd.alltoall(torch.ones(n, dtype=torch.int64 if r == 1 else torch.float32), name="e.a2a"),
           hvd.PushPullError, "alltoall.e.a2a", "int64", "float32", "rank(s) [1]")


@case("error-reuse-with-another-shape", peers=True)
def _():
    """A rank that reuses a name with another shape fails at once, and so does everyone else's round."""
    r = hvd.rank()
    hvd.allreduce(torch.ones(3), name="e.reuse")
    t = torch.ones(4 if r == 1 else 3)
    exc = ValueError if r == 1 else hvd.PushPullError
    raises(lambda: hvd.allreduce(t, name="e.reuse"), exc, "allreduce.e.reuse", "float32[3]", "float32[4]")


# ------------------------------------------------------------------ keywords --

@case("kwargs-optimizer")
def _():
    model = nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    raises(lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_stp=2), TypeError,
           "backward_passes_per_stp", "did you mean 'backward_passes_per_step'")
    raises(lambda: hvd.DistributedOptimizer(sgd, num_groups=2), NotImplementedError, "num_groups")
    raises(lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum), NotImplementedError, "Adasum")
    raises(lambda: hvd.DistributedOptimizer(sgd, strategy="fusion", threshold_byte=1), TypeError,
           "did you mean 'threshold_bytes'")
    hvd.DistributedOptimizer(sgd, strategy="fusion", threshold_bytes=1 << 20, named_parameters=[
        (f"kw.{k}", p) for k, p in model.named_parameters()])


@case("kwargs-collectives")
def _():
    raises(lambda: hvd.allreduce(torch.ones(1), averag=True), TypeError, "did you mean 'average'")
    raises(lambda: hvd.push_pull(torch.ones(1), nme="x"), TypeError, "did you mean 'name'")
    raises(lambda: hvd.broadcast(torch.ones(1), root=0), TypeError, "did you mean 'root_rank'")
    raises(lambda: hvd.allgather(torch.ones(1), device_dense="/cpu:0"), TypeError, "TensorFlow option")
    raises(lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum), NotImplementedError, "Adasum")
    raises(lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0])), NotImplementedError,
           "process sets")
    raises(lambda: hvd.add_process_set([0]), NotImplementedError, "process sets")


def _equiv(name, steps=3, **kw):
    """A DistributedOptimizer with ``kw`` against one process on the concatenated batch."""
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(11)
    model = nn.Linear(3, 2)
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=[(f"{name}.{k}", p) for k, p in model.named_parameters()], **kw)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for s in range(steps):
        xs = everyone(700 + s, torch.float32, lambda k: (4, 3))
        opt.zero_grad()
        nn.functional.mse_loss(model(xs[r]), torch.zeros(4, 2)).backward()
        opt.step()
        ref_opt.zero_grad()
        scale = n if kw.get("op") == hvd.Sum else 1
        (nn.functional.mse_loss(ref(torch.cat(xs)), torch.zeros(4 * n, 2)) * scale).backward()
        ref_opt.step()
    for (k, a), b in zip(model.named_parameters(), ref.parameters()):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
            raise CaseFailed(f"{name}: {k} differs from the reference by {(a - b).abs().max().item():.3g}")


@case("optimizer-horovod-options")
def _():
    _equiv("opt.predivide", gradient_predivide_factor=2.0)
    _equiv("opt.sum", op=hvd.Sum)


class Doubler(hvd.Compressor):
    """A Horovod-style compressor: float64 on the wire, scaled by 2 (undone after)."""

    @staticmethod
    def compress(tensor):
        return tensor.double() * 2, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return (tensor / 2).to(ctx)


@case("compression-horovod-style")
def _():
    r = hvd.rank()
    xs = everyone(800, torch.float32, lambda k: (5,))
    check("custom compressor", hvd.allreduce(xs[r], compression=Doubler, name="cmp.x"), reference(xs, "Average"))
    _equiv("cmp.opt", compression=Doubler)
    c, ctx = hvd.Compression.fp16.compress(torch.ones(2))
    if c.dtype != torch.float16 or hvd.Compression.fp16.decompress(c, ctx).dtype != torch.float32:
        raise CaseFailed("Compression.fp16.compress/decompress do not cast as Horovod's do")
    got = hvd.allreduce(xs[r], compression=hvd.Compression.fp16, name="cmp.fp16")
    if not torch.allclose(got, reference(xs, "Average"), rtol=2e-3, atol=2e-3):
        raise CaseFailed(f"Compression.fp16 on the wire: {got.tolist()} vs {reference(xs, 'Average').tolist()}")


@case("sparse-gradients")
def _():
    r = hvd.rank()
    emb = nn.Embedding(5, 2, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), named_parameters=[("sp.w", emb.weight)])
    if hvd.engine() is not None:
        raises(lambda: emb(torch.tensor([r])).sum().backward(), RuntimeError, "sparse", "sparse_as_dense=True")
        opt._submitted.clear()
        opt._passes.clear()
    emb2 = nn.Embedding(5, 2, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb2.parameters(), lr=0.1), sparse_as_dense=True,
                                   named_parameters=[("sp.w2", emb2.weight)])
    emb2(torch.tensor([r])).sum().backward()
    opt.synchronize()
    want = torch.zeros(5, 2)
    for k in range(hvd.size()):
        want[k % 5] += 1.0 / hvd.size()
    grad = emb2.weight.grad
    check("sparse_as_dense", grad.to_dense() if grad.is_sparse else grad, want)


@case("reinit-after-shutdown")
def _():
    hvd.shutdown()
    if hvd.is_initialized():
        raise CaseFailed("is_initialized() after shutdown()")
    raises(lambda: hvd.allreduce(torch.ones(1)), hvd.NotInitializedError, "init()")
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    check("after re-init", hvd.allreduce(torch.ones(2) * r, op=hvd.Sum, name="reinit"),
          torch.ones(2) * (n * (n - 1) // 2))


@case("horovod-example-loop")
def _():
    """The shape of Horovod's pytorch_mnist.py with only the import changed: DistributedSampler shards,
    broadcast_parameters/optimizer_state, DistributedOptimizer(op=Average, gradient_predivide_factor),
    metric_average through hvd.allreduce(torch.tensor(val), name=...), predictions through allgather."""
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    r, n = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(60, 4, generator=g), torch.randint(0, 3, (60,), generator=g)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    loader = DataLoader(dataset, batch_size=5, sampler=sampler)
    class Net(nn.Module):  # parameter names fc1.*, fc2.*, as in Horovod's example
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

        def forward(self, v):
            return self.fc2(torch.relu(self.fc1(v)))

    torch.manual_seed(100 + r)  # different on purpose: the broadcast makes them equal
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.none, op=hvd.Average,
                                         gradient_predivide_factor=1.0)

    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    for epoch in range(2):
        model.train()
        sampler.set_epoch(epoch)
        for data_, target in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(data_), target).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            shard = x[r::n]
            loss = nn.functional.cross_entropy(model(shard), y[r::n]).item()
            avg = metric_average(loss, "avg_loss")
            want = sum(nn.functional.cross_entropy(model(x[k::n]), y[k::n]).item() for k in range(n)) / n
            if abs(avg - want) > 1e-5:
                raise CaseFailed(f"metric_average {avg} != {want}")
            preds = hvd.allgather(model(shard).argmax(1), name="preds")
            check("allgather of predictions", preds, torch.cat([model(x[k::n]).argmax(1) for k in range(n)]))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name="params")
    for k in range(n):
        check(f"rank {k}'s parameters after training", every[k], flat)


def main() -> None:
    torch.set_num_threads(1)
    only = sys.argv[1:]
    hvd.init()
    for name, fn in CASES.items():
        if only and name not in only:
            continue
        if name in NEEDS_PEERS and hvd.engine() is None:
            print(f"CASE {name} skip rank 0 (one worker)", flush=True)
            continue
        run_case(name, fn)
    hvd.shutdown()
    print("ALL-DONE", flush=True)


def run_case(name: str, fn) -> None:
    """Run one case and print ``CASE <name> ok|FAIL rank <r>`` (the tests count these lines); a failure
    is reported with its traceback and does not stop the next case."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - one case's failure is reported and the next runs
        why = f"{type(e).__name__}: {e}".replace("\n", " | ")
        print(f"CASE {name} FAIL rank {hvd.rank()}: {why[:600]}", flush=True)
        traceback.print_exc()
        return
    print(f"CASE {name} ok rank {hvd.rank()} {time.monotonic() - t0:.2f}s", flush=True)


if __name__ == "__main__":
    main()
