"""Worker program for the MXNet tests (tests/cluster/test_mxnet_api.py), run in the MXNet environment under
``pushpull launch`` or alone. Data are deterministic functions of (rank, step), so every worker
trains a single-process reference on the global batch. A failure prints ``FAIL rank r: ...``."""
from __future__ import annotations

import argparse
import importlib.util
import os
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import pushpull.mxnet as bps
from pushpull.worker.context import CONTEXT  # the job context every binding shares

HAVE_TORCH = importlib.util.find_spec("torch") is not None  # scripts/test-mxnet.sh's environment has none

D_IN, HIDDEN, D_OUT = 6, 16, 3
STEPS, B = 5, 8
LOSS = gluon.loss.SoftmaxCrossEntropyLoss()


def fail(msg: str) -> None:
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    os._exit(3)


def expect(cond: bool, msg: str) -> None:
    if not cond:
        fail(msg)


def close(name: str, got, want, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = np.abs(got - want).max() if got.shape == want.shape else "shape"
        fail(f"{name}: differs from the expected value (max abs diff {diff})")


def batch(rank: int, step: int, b: int = B):
    g = np.random.default_rng(1000 * step + rank)
    return (mx.nd.array(g.standard_normal((b, D_IN)).astype(np.float32)),
            mx.nd.array(g.integers(0, D_OUT, b).astype(np.float32)))


def global_batch(step: int):
    xs, ys = zip(*(batch(r, step) for r in range(bps.size())))
    return mx.nd.concat(*xs, dim=0), mx.nd.concat(*ys, dim=0)


def make_net(seed: int):
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(HIDDEN, in_units=D_IN, activation="tanh"), gluon.nn.Dense(D_OUT, in_units=HIDDEN))
    net.initialize(mx.init.Xavier())
    return net


def weights(net) -> list[np.ndarray]:
    return [p.data().asnumpy() for p in net.collect_params().values()]


def train(net, trainer, data, step_size: int) -> None:
    for x, y in data:
        with autograd.record():
            loss = LOSS(net(x), y)
        loss.backward()
        trainer.step(step_size)


def reference() -> list[np.ndarray]:
    net = make_net(1)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    train(net, trainer, [global_batch(s) for s in range(STEPS)], bps.size() * B)
    return weights(net)


# ------------------------------------------------------------------ cases --

def case_collectives() -> None:
    r, n = bps.rank(), bps.size()
    ranks = np.arange(n)
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    for dt in (np.float32, np.float64, np.float16, np.int32, np.int64):
        got = bps.allreduce(mx.nd.array(base * (r + 1), dtype=dt), average=False, name=f"sum.{np.dtype(dt).name}")
        expect(np.dtype(got.dtype) == np.dtype(dt), f"allreduce of {np.dtype(dt).name} returned {got.dtype}")
        close(f"allreduce sum {np.dtype(dt).name}", got.asnumpy().astype(np.float64), base * (ranks + 1).sum(),
              rtol=0, atol=0)
    x = mx.nd.array(base * (r + 1))
    close("allreduce average", bps.allreduce(x, name="avg").asnumpy(), base * (ranks + 1).mean())
    close("allreduce leaves its input alone", x.asnumpy(), base * (r + 1))
    bps.byteps_push_pull(x, name="inplace", is_average=False)
    close("byteps_push_pull in place", x.asnumpy(), base * (ranks + 1).sum())
    close("pre/postscale", bps.allreduce(mx.nd.array(base), average=False, name="scaled", prescale_factor=0.5,
                                         postscale_factor=3.0).asnumpy(), base * 0.5 * n * 3.0)
    big = np.linspace(-1, 1, 32768, dtype=np.float32) * (r + 1)  # above BYTEPS_MIN_COMPRESS_BYTES
    if HAVE_TORCH:
        got = bps.allreduce(mx.nd.array(big), name="fp16", compression=bps.Compression.fp16).asnumpy()
        close("allreduce with Compression.fp16", got, big / (r + 1) * (ranks + 1).mean(), rtol=2e-3, atol=2e-3)
        if CONTEXT.engine is not None:
            expect(bool(CONTEXT.engine.table.entries["allreduce.mx.fp16"].compression),
                   "Compression.fp16 did not reach the engine")
    elif bps.distributed():  # the compressors are written in torch: a clear error, not a crash
        try:
            bps.allreduce(mx.nd.array(big), name="fp16", compression=bps.Compression.fp16)
        except ValueError as e:
            expect("needs torch" in str(e), f"Compression.fp16 without torch: {e}")
        else:
            expect(False, "Compression.fp16 without torch raised nothing")
    root = n - 1
    v = np.array([-0.0, np.nan, np.inf, 1.5 + r], np.float32)
    got = bps.broadcast(mx.nd.array(v), root_rank=root, name="bc").asnumpy()
    want = np.array([-0.0, np.nan, np.inf, 1.5 + root], np.float32)
    expect(got.tobytes() == want.tobytes(), f"broadcast not bit-exact: {got} vs {want}")
    net = make_net(r + 1)
    bps.broadcast_parameters(net.collect_params(), root_rank=0)
    for a, b in zip(weights(net), weights(make_net(1))):
        close("broadcast_parameters", a, b, rtol=0, atol=0)
    if n > 1:
        bad = {"w": mx.nd.zeros((2 + (r == n - 1),))}
        try:
            bps.broadcast_parameters(bad, root_rank=0, prefix="bad.")
            fail("broadcast_parameters with different shapes did not raise")
        except bps.BroadcastError as e:
            expect("differs" in str(e), f"unexpected message: {e}")
    obj = bps.broadcast_object({"epoch": 3 + r}, root_rank=root, name="obj")
    expect(obj == {"epoch": 3 + root}, f"broadcast_object: {obj}")


def case_trainer() -> None:
    """DistributedTrainer: N workers x batch b, step(b) == one process x batch N*b, step(N*b)."""
    r = bps.rank()
    ref = reference()
    net = make_net(r + 1)  # different on purpose: the trainer broadcasts rank 0's before the first step
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                                     prefix="dt")
    train(net, trainer, [batch(r, s) for s in range(STEPS)], B)
    for i, (a, b) in enumerate(zip(weights(net), ref)):
        close(f"DistributedTrainer parameter {i}", a, b)


def case_kvstore() -> None:
    """gluon.Trainer(kvstore=mx.kv.create("pushpull")) and ScheduledKVStore("dist_sync"): dist_sync's sums,
    so step(N*b) on every worker == one process with step(N*b) on the global batch."""
    r, n = bps.rank(), bps.size()
    ref = reference()
    for kind in ("create", "scheduled"):
        kv = mx.kv.create("pushpull") if kind == "create" else bps.ScheduledKVStore("dist_sync", prefix="skv")
        expect(kv.num_workers == n and kv.rank == r, f"kvstore rank/num_workers: {kv.rank}/{kv.num_workers}")
        # Gluon broadcasts through the kvstore at its first step, after that step's backward (as with
        # dist_sync), so the first gradients come from each worker's own init: start from the same one
        net = make_net(1)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
        train(net, trainer, [batch(r, s) for s in range(STEPS)], n * B)
        for i, (a, b) in enumerate(zip(weights(net), ref)):
            close(f"gluon.Trainer with kvstore ({kind}) parameter {i}", a, b)
    # the classic calls: init (rank 0's value wins), push (sum over workers and devices), pull
    kv = bps.ScheduledKVStore(mx.kv.create("local"), prefix="classic")
    kv.init(3, mx.nd.full((4,), float(r + 10)))
    out = mx.nd.zeros((4,))
    kv.pull(3, out=out)
    close("init then pull", out.asnumpy(), np.full(4, 10.0))
    for step in range(2):
        kv.push(3, [mx.nd.full((4,), float(r + step)), mx.nd.ones((4,))])
        kv.pull(3, out=out)
        want = sum(k + step for k in range(n)) + n  # every worker's two devices, summed
        close(f"push/pull round {step}", out.asnumpy(), np.full(4, float(want)))


def case_optimizer() -> None:
    """DistributedOptimizer in a plain gluon.Trainer (no kvstore) == the reference."""
    r = bps.rank()
    ref = reference()
    net = make_net(r + 1)
    bps.broadcast_parameters(net.collect_params(), root_rank=0, prefix="opt.init.")
    opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9))
    trainer = gluon.Trainer(net.collect_params(), opt, kvstore=None)
    train(net, trainer, [batch(r, s) for s in range(STEPS)], B)
    for i, (a, b) in enumerate(zip(weights(net), ref)):
        close(f"DistributedOptimizer parameter {i}", a, b)


def case_order() -> None:
    """DistributedTrainer starts the pushes last parameter first, priority minus the index."""
    if not bps.distributed():
        return
    calls = []
    orig = CONTEXT.push_pull_async

    def recording(t, output, average, name, priority=0, compression=None):
        calls.append((name, priority))
        return orig(t, output, average, name, priority, compression)

    net = make_net(1)
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, prefix="ord",
                                     root_rank=None)
    CONTEXT.push_pull_async = recording
    try:
        train(net, trainer, [batch(bps.rank(), 0)], B)
    finally:
        del CONTEXT.push_pull_async  # the class's method again
    expect([p for _, p in calls] == [-3, -2, -1, 0], f"push order/priorities: {calls}")


CASES = {"collectives": case_collectives, "trainer": case_trainer, "kvstore": case_kvstore,
         "optimizer": case_optimizer, "order": case_order}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", choices=list(CASES) + ["all"])
    args = p.parse_args()
    bps.init()
    for c in (list(CASES) if "all" in args.cases else args.cases):
        t = time.monotonic()
        CASES[c]()
        print(f"case {c} ok on rank {bps.rank()}/{bps.size()} in {time.monotonic() - t:.2f}s", flush=True)
    bps.shutdown()
    print("ALL-OK", flush=True)


if __name__ == "__main__":
    main()
