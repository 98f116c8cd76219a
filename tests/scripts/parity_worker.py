"""Worker program for tests/cluster/test_horovod_parity.py: what Horovod's own test suite expects where
pushpull used to differ (issue 28, findings 1-9), written from Horovod's documented semantics.

``parity_worker.py main`` runs the cases that need no short deadline; ``parity_worker.py deadline`` the ones
where a rank stays away on purpose, under a short PUSHPULL_TIMEOUT (every rank goes on after a barrier).
Each case prints ``CASE <name> ok`` or ``CASE <name> FAIL <why>`` (tests/scripts/coll_worker.py's loop).
"""
from __future__ import annotations

import os
import sys
import time

import torch

import pushpull.torch as hvd
from coll_worker import CaseFailed, check, data, everyone, raises, reference, run_case

MAIN: dict = {}
DEADLINE: dict = {}


def case(table: dict, name: str):
    def deco(fn):
        table[name] = fn
        return fn
    return deco


# ------------------------------------------------------------------ finding 1: disagreement, then later calls --

@case(MAIN, "f1-unnamed-shape-disagreement")
def _():
    """Horovod's test_horovod_allreduce_error: an unnamed call whose shape differs on rank 1 fails fast on
    every rank, and the next unnamed call of either shape sums only its own pushes (30, not 1 + 10)."""
    r, n = hvd.rank(), hvd.size()
    bad = torch.ones(4 if r == 1 else 3)
    raises(lambda: hvd.allreduce(bad, op=hvd.Sum), hvd.PushPullError, "rank(s) [1]", "float32[4]", "float32[3]")
    for shape in (3, 4):
        got = hvd.allreduce(torch.full((shape,), 10.0 * (r + 1)), op=hvd.Sum)
        check(f"the next unnamed call of shape [{shape}]", got, torch.full((shape,), 10.0 * n * (n + 1) / 2))


@case(MAIN, "f1-named-shape-disagreement")
def _():
    """The same with a name: every rank fails fast naming the rank and both shapes; later calls are right."""
    r, n = hvd.rank(), hvd.size()
    bad = torch.ones(4 if r == 1 else 3)
    raises(lambda: hvd.allreduce(bad, op=hvd.Sum, name="f1.named"), (hvd.PushPullError, ValueError),
           "f1.named", "rank 1", "float32[4]", "float32[3]")
    got = hvd.allreduce(torch.full((3,), 10.0 * (r + 1)), op=hvd.Sum, name="f1.named.after")
    check("a later named call", got, torch.full((3,), 10.0 * n * (n + 1) / 2))
    got = hvd.allreduce(torch.full((3,), 10.0 * (r + 1)), op=hvd.Sum)
    check("a later unnamed call", got, torch.full((3,), 10.0 * n * (n + 1) / 2))


# ------------------------------------------------------------------ findings 2 and 9: collectives around join --

@case(MAIN, "f2-broadcast-while-joined")
def _():
    """Horovod's test_horovod_join_broadcast: a broadcast while a rank is in join() raises on the others,
    naming the joined rank, whether the root is a training rank or the joined one (was: zeros)."""
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    if r == last:
        got = hvd.join()
    else:
        raises(lambda: hvd.broadcast(torch.ones(3) * r, 0, name="f2.bc"), hvd.PushPullError, "f2.bc",
               f"rank(s) [{last}]", "join()")
        raises(lambda: hvd.broadcast(torch.ones(3) * r, last, name="f2.bc.root"), hvd.PushPullError,
               "f2.bc.root", f"rank(s) [{last}]", "join()")
        got = hvd.join()
    if not 0 <= got < n:
        raise CaseFailed(f"join() returned {got}")
    check("after the join, a broadcast", hvd.broadcast(torch.ones(2) * r, last, name="f2.bc.after"),
          torch.ones(2) * last)


@case(MAIN, "f9-allgather-while-joined")
def _():
    """docs/api.md: a rank in join() contributes no rows to an allgather (was: 'disagree on dtype')."""
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    xs = everyone(900, torch.float32, lambda k: (k + 1, 2))
    if r != last:
        check("allgather without the joined rank", hvd.allgather(xs[r], name="f9.ag"), torch.cat(xs[:last]))
    hvd.join()
    check("allgather after the join", hvd.allgather(xs[r], name="f9.ag.after"), torch.cat(xs))


@case(MAIN, "f9-grouped-allgather-reducescatter")
def _():
    """Horovod's grouped_allgather and grouped_reducescatter: each tensor as its own call would give."""
    r, n = hvd.rank(), hvd.size()
    a = everyone(910, torch.float32, lambda k: (k + 1, 3))
    b = everyone(911, torch.int64, lambda k: (2, 2))
    got = hvd.grouped_allgather([a[r], b[r]], name="f9.gag")
    check("grouped_allgather [0]", got[0], torch.cat(a))
    check("grouped_allgather [1]", got[1], torch.cat(b))
    got = hvd.grouped_allgather([a[r], b[r]])  # unnamed: twice, the second reuses the first's keys
    got = hvd.grouped_allgather([a[r], b[r]])
    check("unnamed grouped_allgather", got[1], torch.cat(b))
    c = everyone(912, torch.float64, lambda k: (2 * n, 2))
    d = everyone(913, torch.float32, lambda k: (n, 3))
    for name in ("f9.grs", None):
        got = hvd.grouped_reducescatter([c[r], d[r]], name=name, op=hvd.Sum)
        check(f"grouped_reducescatter [0] ({name})", got[0], reference(c, "Sum")[2 * r:2 * r + 2])
        check(f"grouped_reducescatter [1] ({name})", got[1], reference(d, "Sum")[r:r + 1])


# ------------------------------------------------------------------ finding 5: gradient conventions --

@case(MAIN, "f5-grad-allgather-averaged")
def _():
    """Horovod's allgather gradient: rank r's rows of the average of every rank's upstream gradient."""
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) // 2
    x = data(920, r, torch.float64, (r + 1, 2)).requires_grad_()
    w = data(921, r, torch.float64, (total, 2))
    (hvd.allgather(x, name="f5.ag") * w).sum().backward()
    ws = everyone(921, torch.float64, lambda k: (total, 2))
    start = r * (r + 1) // 2
    check("grad of allgather", x.grad, (sum(ws) / n)[start:start + r + 1])
    y = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)  # test_horovod_allgather_grad's shape of it
    hvd.allgather(y).sum().backward()
    check("grad of an unnamed allgather of ones", y.grad, torch.ones(2, 2, dtype=torch.float64))
    check("the next unnamed call still pairs up", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), n * 1.0))


@case(MAIN, "f5-grad-reducescatter")
def _():
    """Horovod's reducescatter gradients: the gathered upstream gradient times size() for Sum, 1x for
    Average (test_horovod_reducescatter_grad, _grad_average)."""
    r, n = hvd.rank(), hvd.size()
    ws = everyone(931, torch.float64, lambda k: (2, 3))
    for op, factor in (("Sum", n), ("Average", 1)):
        x = data(930, r, torch.float64, (2 * n, 3)).requires_grad_()
        out = hvd.reducescatter(x, op=getattr(hvd, op), name=f"f5.rs.{op}")
        (out * ws[r]).sum().backward()
        check(f"grad of reducescatter({op})", x.grad, torch.cat(ws) * factor)


# ------------------------------------------------------------------ finding 6: averages divide --

@case(MAIN, "f6-average-divides-by-the-count")
def _():
    """An average is the sum divided by the count (x * (1/3) is one rounding off for 5, 7, 10, ...)."""
    r, n = hvd.rank(), hvd.size()
    base = torch.arange(1, 301, dtype=torch.float32)  # integer sums: exact in any order of addition
    xs = [base * (k + 1) for k in range(n)]
    want = sum(xs) / n
    for name in ("f6.avg", None):
        got = hvd.allreduce(xs[r], op=hvd.Average, name=name)
        if not torch.equal(got, want):
            bad = (got != want).nonzero().flatten()[:4].tolist()
            raise CaseFailed(f"average ({name}): at {bad} got {got[bad].tolist()}, want {want[bad].tolist()}")
    big = torch.arange(1, 300_001, dtype=torch.float32) % 301  # several partitions, through the engine
    got = hvd.push_pull(big * (r + 1), average=True, name="f6.big")
    if not torch.equal(got, big * (n * (n + 1) / 2) / n):
        raise CaseFailed("a multi-partition average differs from the sum divided by the count")


# ------------------------------------------------------------------ findings 7 and 8: argument errors --

@case(MAIN, "f7-alltoall-float-splits")
def _():
    n = hvd.size()
    t = torch.ones(2 * n, 2)
    raises(lambda: hvd.alltoall(t, splits=[0.6] + [1] * (n - 1), name="f7.a"), ValueError, "integers", "0.6")
    raises(lambda: hvd.alltoall(t, splits=torch.tensor([0.5] * n), name="f7.b"), ValueError, "integers",
           "float32")
    out = hvd.alltoall(t, splits=torch.tensor([2] * n, dtype=torch.int64), name="f7.ok")[0]
    check("integer splits still work", out, torch.ones(2 * n, 2))


@case(MAIN, "f8-reducescatter-scalar")
def _():
    raises(lambda: hvd.reducescatter(torch.tensor(1.0), name="f8.rs"), ValueError, "f8.rs", "0-d")
    raises(lambda: hvd.reducescatter(torch.tensor(1.0, requires_grad=True), name="f8.rsg"), ValueError, "0-d")


# ------------------------------------------------------------------ deadlines (short PUSHPULL_TIMEOUT) --

def _timeout() -> float:
    return float(hvd.config().timeout)


def _within_deadline(fn, needles, what: str) -> None:
    """``fn`` raises PushPullError naming ``needles`` after about one PUSHPULL_TIMEOUT, not several."""
    t0 = time.monotonic()
    try:
        fn()
    except hvd.PushPullError as e:
        took, text = time.monotonic() - t0, str(e)
        missing = [s for s in needles if s not in text]
        if missing:
            raise CaseFailed(f"{what}: the error does not mention {missing}: {text}") from None
        if took > 1.6 * _timeout() + 2:
            raise CaseFailed(f"{what}: raised after {took:.1f}s, PUSHPULL_TIMEOUT is {_timeout():.0f}s "
                             f"(one deadline per operation): {text}") from None
        return
    raise CaseFailed(f"{what}: no PushPullError")


def _away() -> None:
    """The rank that stays away reaches the next barrier after the others' deadline (a barrier waits
    PUSHPULL_TIMEOUT too)."""
    time.sleep(_timeout() + 1.0)


@case(DEADLINE, "f3-join-deadline")
def _():
    """A rank in join() whose peer never joins raises after PUSHPULL_TIMEOUT naming it (was: forever)."""
    r, n = hvd.rank(), hvd.size()
    if r == n - 1:
        time.sleep(_timeout() + 1.5)  # stays away past the others' deadline, then joins (the job goes on)
        hvd.join()
    else:
        _within_deadline(hvd.join, [f"rank(s) [{n - 1}]", "join()", "PUSHPULL_TIMEOUT"], "join()")
    hvd.barrier()


@case(DEADLINE, "f4-grouped-allreduce-deadline")
def _():
    """grouped_allreduce of 5 tensors with a rank away: one deadline, not one per tensor in turn."""
    r, n = hvd.rank(), hvd.size()
    if r != n - 1:
        _within_deadline(lambda: hvd.grouped_allreduce([torch.ones(3 + i) for i in range(5)], name="f4.grp"),
                         ["f4.grp", f"[{n - 1}]"], "grouped_allreduce")
    else:
        _away()
    hvd.barrier()


@case(DEADLINE, "f4-reducescatter-deadline")
def _():
    """reducescatter (one key per rank) with a rank away: one deadline for the operation."""
    r, n = hvd.rank(), hvd.size()
    if r != n - 1:
        _within_deadline(lambda: hvd.reducescatter(torch.ones(4 * n, 2), name="f4.rs"), ["f4.rs", f"[{n - 1}]"],
                         "reducescatter")
    else:
        _away()
    hvd.barrier()


@case(DEADLINE, "f1-after-a-timeout-no-wrong-sum")
def _():
    """A rank's unnamed call that timed out alone never reaches a later call: the ranks' next unnamed
    call of that shape raises or sums right (never rank 0's old 1 + the others' 10s)."""
    r, n = hvd.rank(), hvd.size()
    if r == 0:
        _within_deadline(lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum), ["[1"], "a lone unnamed allreduce")
    else:
        _away()
    hvd.barrier()
    try:
        got = hvd.allreduce(torch.full((2,), 10.0), op=hvd.Sum)
    except hvd.PushPullError:
        return
    check("the next unnamed call", got, torch.full((2,), 10.0 * n))


def _lone_named_call_then_together(name: str, numel: int) -> None:
    """A named tensor in use on every rank; rank 0 calls it alone and times out; then every rank calls it
    twice. Each of those calls raises at once (rank 0's round was abandoned, and with it the name) or sums
    right: never rank 0's old 1 with the others' 10s, never a wait for another deadline, never a ValueError."""
    r, n = hvd.rank(), hvd.size()
    check("the first call", hvd.allreduce(torch.ones(numel), op=hvd.Sum, name=name), torch.full((numel,), float(n)))
    hvd.barrier()
    if r == 0:
        _within_deadline(lambda: hvd.allreduce(torch.ones(numel), op=hvd.Sum, name=name), ["[1"],
                         "a lone named allreduce")
    else:
        _away()
    hvd.barrier()
    for v in (10.0, 5.0):
        t0 = time.monotonic()
        try:
            got = hvd.allreduce(torch.full((numel,), v), op=hvd.Sum, name=name)
        except hvd.PushPullError as e:
            took = time.monotonic() - t0
            if took > _timeout() / 2:
                raise CaseFailed(f"call of {v}: raised after {took:.1f}s, not at once: {e}") from None
            if name not in str(e) or "rank 0" not in str(e):
                raise CaseFailed(f"call of {v}: the error names neither the tensor nor rank 0: {e}") from None
            continue
        check(f"the call of {v} after rank 0's timeout", got, torch.full((numel,), v * n))
    hvd.barrier()


@case(DEADLINE, "f1-after-a-timeout-named-small")
def _():
    """As the unnamed case, named, one small partition (the direct path on the caller's thread)."""
    _lone_named_call_then_together("f1.named.small", 2)


@case(DEADLINE, "f1-after-a-timeout-named-partitioned")
def _():
    """As the unnamed case, named, several partitions on several servers (the engine's pipeline)."""
    _lone_named_call_then_together("f1.named.big", 3_000_000)


def leaver() -> None:
    """The last rank shuts down without join() while the others wait in it: they must hear of it at once,
    naming the rank, not after PUSHPULL_TIMEOUT (a Horovod job would hang)."""
    r, n = hvd.rank(), hvd.size()
    hvd.barrier()
    if r == n - 1:
        time.sleep(1.0)  # the others are in join() by now
        hvd.shutdown()
        print("LEFT", flush=True)
        return
    t0 = time.monotonic()
    try:
        hvd.join()
    except hvd.PushPullError as e:
        took, text = time.monotonic() - t0, str(e)
        if f"worker rank {n - 1} finished without calling join()" in text and took < _timeout() / 2:
            print(f"CASE f3-peer-left ok rank {r} {took:.2f}s", flush=True)
        else:
            print(f"CASE f3-peer-left FAIL rank {r}: after {took:.1f}s: {text}", flush=True)
    else:
        print(f"CASE f3-peer-left FAIL rank {r}: join() returned", flush=True)
    time.sleep(1.0)  # the other waiting ranks report before this one's exit ends the job (the launcher stops it)
    os._exit(0)  # this worker's membership failed: nothing is left to shut down cleanly


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1:] == ["leaver"]:
        hvd.init()
        leaver()
        return
    table = DEADLINE if sys.argv[1:] == ["deadline"] else MAIN
    hvd.init()
    for name, fn in table.items():
        run_case(name, fn)
    hvd.shutdown()
    print("ALL-DONE", flush=True)


if __name__ == "__main__":
    main()
