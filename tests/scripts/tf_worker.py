"""Worker program for the TensorFlow/Keras tests (tests/cluster/test_tensorflow_api.py), run under
``pushpull launch`` or alone (single-process mode).

As in api_worker.py, data are deterministic functions of (rank, step), so every
worker rebuilds the global batch and trains a single-process reference on it.
A failure prints ``FAIL rank r: ...`` and exits non-zero at once.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pushpull.tensorflow as bps  # noqa: E402
import pushpull.tensorflow.keras as hvd  # noqa: E402 - Horovod's module path
from pushpull.worker.context import CONTEXT  # noqa: E402 - the job context every binding shares

HAVE_TORCH = importlib.util.find_spec("torch") is not None  # tests/cluster/test_no_torch.py runs without it

D_IN, HIDDEN, D_OUT = 6, 16, 3
STEPS, B = 5, 8


def fail(msg: str) -> None:
    print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
    os._exit(3)


def expect(cond: bool, msg: str) -> None:
    if not cond:
        fail(msg)


def expect_raises(exc, needle: str, fn, what: str) -> None:
    try:
        fn()
    except exc as e:
        if needle not in str(e):
            fail(f"{what}: error does not mention {needle!r}: {e}")
        return
    fail(f"{what}: no {exc.__name__} raised")


def close(name: str, got, want, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = np.abs(got - want).max() if got.shape == want.shape else "shape"
        fail(f"{name}: differs from the single-process reference (max abs diff {diff})")


def batch(rank: int, step: int, b: int = B) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(1000 * step + rank)
    return g.standard_normal((b, D_IN)).astype(np.float32), g.integers(0, D_OUT, b).astype(np.int64)


def global_batch(step: int, b: int = B) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = zip(*(batch(r, step, b) for r in range(bps.size())))
    return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------------------ collectives --

def case_collectives() -> None:
    """allreduce (ops, dtypes, scale factors, eager and tf.function), broadcasts, objects."""
    r, n = bps.rank(), bps.size()
    ranks = np.arange(n)
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    for dt in (tf.float32, tf.float64, tf.float16, tf.bfloat16):
        x = tf.cast(base * (r + 1), dt)
        got = bps.allreduce(x, op=bps.Sum, name=f"sum.{dt.name}")
        expect(got.dtype == dt, f"allreduce Sum of {dt.name} returned {got.dtype.name}")
        close(f"allreduce Sum {dt.name}", tf.cast(got, tf.float64), base * (ranks + 1).sum(), rtol=0, atol=0)
    xi = tf.constant([3 + r, -3 - r, 7], dtype=tf.int32)
    avg_i = bps.allreduce(xi, name="avg.i32")  # integer average truncates toward zero
    want_i = np.trunc(np.array([sum(3 + k for k in ranks), sum(-3 - k for k in ranks), 7 * n]) / n)
    close("integer average", avg_i, want_i.astype(np.int32), rtol=0, atol=0)
    got = bps.allreduce(tf.constant(base * (r + 1), tf.float32), name="avg.f32")
    close("allreduce Average", got, base * (ranks + 1).mean())
    got = bps.push_pull(tf.constant(base, tf.float32), average=False, name="pp.sum")
    close("push_pull average=False", got, base * n)
    got = bps.allreduce(tf.constant(base, tf.float32), op=bps.Sum, prescale_factor=0.5, postscale_factor=3.0,
                        name="scaled")
    close("pre/postscale", got, base * 0.5 * n * 3.0)
    gs = bps.grouped_allreduce([tf.constant(float(r)), tf.constant([1.0, r])], name="grouped")
    close("grouped_allreduce[0]", gs[0], ranks.mean())
    close("grouped_allreduce[1]", gs[1], [1.0, ranks.mean()])
    # compression: the engine's codecs (fp16 on the wire); 32k floats, above BYTEPS_MIN_COMPRESS_BYTES
    big = np.linspace(-1, 1, 32768, dtype=np.float32) * (r + 1)
    if HAVE_TORCH:
        got = bps.allreduce(tf.constant(big), name="fp16", compression=bps.Compression.fp16)
        close("allreduce with Compression.fp16", got, big / (r + 1) * (ranks + 1).mean(), rtol=2e-3, atol=2e-3)
        eng = CONTEXT.engine
        if eng is not None:
            expect(bool(eng.table.entries["allreduce.fp16"].compression), "Compression.fp16 did not reach the engine")
    elif bps.distributed():  # the compressors are written in torch: a clear error, not a crash
        expect_raises(ValueError, "needs torch", lambda: bps.allreduce(tf.constant(big), name="fp16",
                                                                       compression=bps.Compression.fp16),
                      "Compression.fp16 without torch")
    expect_raises(NotImplementedError, "op=Average and op=Sum", lambda: bps.allreduce(tf.ones(2), op=bps.Max),
                  "allreduce op=Max")
    expect_raises(ValueError, "not both", lambda: bps.allreduce(tf.ones(2), average=True, op=bps.Sum),
                  "average= and op= together")
    expect_raises(TypeError, "cannot be summed", lambda: bps.allreduce(tf.constant([True])), "bool allreduce")

    @tf.function
    def in_graph(x):
        return bps.allreduce(x, name="graph.avg"), bps.allreduce(x * 2, op=bps.Sum, name="graph.sum")

    for _ in range(2):  # the second call reuses the traced graph: new handles, same keys
        a, s = in_graph(tf.constant(base * (r + 1), tf.float32))
        close("allreduce in tf.function", a, base * (ranks + 1).mean())
        close("allreduce Sum in tf.function", s, 2 * base * (ranks + 1).sum())

    # broadcast: bit-exact from the last rank, awkward floats included
    root = n - 1
    v = np.array([-0.0, np.nan, np.inf, 1.5 + r], np.float32)
    got = bps.broadcast(tf.constant(v), root_rank=root, name="bc")
    want = np.array([-0.0, np.nan, np.inf, 1.5 + root], np.float32)
    expect(got.numpy().tobytes() == want.tobytes(), f"broadcast not bit-exact: {got.numpy()} vs {want}")
    bgraph = tf.function(lambda t: bps.broadcast(t, root_rank=root, name="bc.graph"))
    expect(bgraph(tf.constant(v)).numpy().tobytes() == want.tobytes(), "broadcast in tf.function")

    variables = [tf.Variable(np.full((2, 3), r, np.float32)), tf.Variable(np.full((4,), -r, np.int64)),
                 tf.Variable(tf.cast(np.full((2,), r + 0.5), tf.bfloat16)), tf.Variable([r % 2 == 0])]
    bps.broadcast_variables(variables, root_rank=root, prefix="bv")
    expect(np.all(variables[0].numpy() == root) and np.all(variables[1].numpy() == -root), "broadcast_variables")
    expect(np.all(tf.cast(variables[2], tf.float32).numpy() == root + 0.5), "broadcast_variables bfloat16")
    expect(bool(variables[3].numpy()[0]) == (root % 2 == 0), "broadcast_variables bool")
    gv = [tf.Variable(np.full((3,), 10.0 * r, np.float32))]
    @tf.function
    def bcast_in_graph():
        bps.broadcast_variables(gv, root_rank=0, prefix="bv.graph")  # assigns run: tf.function's auto deps

    bcast_in_graph()
    expect(np.all(gv[0].numpy() == 0.0), f"broadcast_variables in tf.function: {gv[0].numpy()}")
    if n > 1:  # every rank learns that the sets differ, naming the rank
        mine = [tf.Variable(np.zeros((2 + (r == n - 1),), np.float32))]
        expect_raises(bps.BroadcastError, "differs",
                      lambda: bps.broadcast_variables(mine, root_rank=0, prefix="bv.bad"),
                      "broadcast_variables with different shapes")
    obj = bps.broadcast_object({"epoch": 3 + r, "name": f"rank{r}"}, root_rank=root, name="obj")
    expect(obj == {"epoch": 3 + root, "name": f"rank{root}"}, f"broadcast_object: {obj}")
    expect_raises(RuntimeError, "eager", lambda: bps.broadcast_global_variables(0),
                  "broadcast_global_variables eagerly")


# ------------------------------------------------------------------ tape --

def make_vars(seed: int) -> list[tf.Variable]:
    g = np.random.default_rng(seed)
    return [tf.Variable(g.standard_normal((D_IN, HIDDEN)).astype(np.float32) * 0.5, name="w1"),
            tf.Variable(np.zeros(HIDDEN, np.float32), name="b1"),
            tf.Variable(g.standard_normal((HIDDEN, D_OUT)).astype(np.float32) * 0.5, name="w2"),
            tf.Variable(np.zeros(D_OUT, np.float32), name="b2")]


def forward(vs, x):
    h = tf.tanh(x @ vs[0] + vs[1])
    return h @ vs[2] + vs[3]


def loss_fn(vs, x, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, forward(vs, x)))


def tape_reference() -> list[np.ndarray]:
    vs = make_vars(1)
    v = [np.zeros(t.shape, np.float32) for t in vs]
    for step in range(STEPS):
        x, y = global_batch(step)
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, x, y)
        for i, (t, g) in enumerate(zip(vs, tape.gradient(loss, vs))):
            v[i] = 0.9 * v[i] + g.numpy()
            t.assign_sub(0.1 * v[i])
    return [t.numpy() for t in vs]


def case_tape() -> None:
    """DistributedGradientTape: N workers x batch b == one process x batch N*b, eagerly and in tf.function."""
    r = bps.rank()
    ref = tape_reference()
    for mode in ("eager", "function"):
        vs = make_vars(r + 1)  # different on purpose: the broadcast makes them the root's
        bps.broadcast_variables(vs, root_rank=0, prefix=f"tape.{mode}")
        vel = [tf.Variable(tf.zeros_like(t)) for t in vs]

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(vs, x, y)
            tape = bps.DistributedGradientTape(tape, name=f"tape.{mode}")
            for t, m, g in zip(vs, vel, tape.gradient(loss, vs)):
                m.assign(0.9 * m + g)
                t.assign_sub(0.1 * m)

        if mode == "function":
            step = tf.function(step)
        for s in range(STEPS):
            step(*batch(r, s))
        for i, (t, want) in enumerate(zip(vs, ref)):
            close(f"DistributedGradientTape ({mode}) variable {i}", t.numpy(), want)


def case_order() -> None:
    """Inside tf.function the pushes are started last layer first with priority -forward index."""
    if not bps.distributed():
        return
    calls = []
    orig = CONTEXT.push_pull_async

    def recording(t, output, average, name, priority=0, compression=None):
        calls.append((name, priority))
        return orig(t, output, average, name, priority, compression)

    vs = make_vars(1)

    @tf.function
    def grads(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, x, y)
        return bps.DistributedGradientTape(tape, name="order").gradient(loss, vs)

    CONTEXT.push_pull_async = recording
    try:
        grads(*batch(bps.rank(), 0))
    finally:
        del CONTEXT.push_pull_async  # the class's method again
    expect([p for _, p in calls] == [-3, -2, -1, 0], f"push order/priorities: {calls}")
    expect(calls[0][0].startswith("order.3."), f"first push is not the last layer's: {calls}")


# ------------------------------------------------------------------ keras --

def make_keras(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((D_IN,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                             keras.layers.Dense(D_OUT)])


def _compile(model, opt):
    import keras

    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)


def case_keras() -> None:
    """model.fit with hvd.DistributedOptimizer and the broadcast callback == one process with batch N*b;
    MetricAverageCallback leaves the same, averaged, loss on every rank."""
    import keras

    r, n = bps.rank(), bps.size()
    ref = make_keras(1)
    _compile(ref, keras.optimizers.SGD(0.1, momentum=0.9))
    xs, ys = zip(*(global_batch(s) for s in range(STEPS)))
    ref.fit(np.concatenate(xs), np.concatenate(ys), batch_size=n * B, epochs=1, shuffle=False, verbose=0)

    model = make_keras(r + 1)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    expect(isinstance(opt, keras.optimizers.SGD), "DistributedOptimizer is not an instance of the user's class")
    _compile(model, opt)
    local, averaged = {}, {}

    class Grab(keras.callbacks.Callback):
        def __init__(self, into):
            super().__init__()
            self.into = into

        def on_epoch_end(self, epoch, logs=None):
            self.into["loss"] = float(logs["loss"])

    xs, ys = zip(*(batch(r, s) for s in range(STEPS)))
    model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Grab(local),
                         hvd.callbacks.MetricAverageCallback(), Grab(averaged)])
    for i, (a, b) in enumerate(zip(model.get_weights(), ref.get_weights())):
        close(f"keras fit with DistributedOptimizer, weight {i}", a, b)
    mean_local = float(hvd.allreduce(np.array(local["loss"]), name="check.loss"))
    close("MetricAverageCallback: the average of the workers' losses", averaged["loss"], mean_local)
    root = float(hvd.broadcast(np.array(averaged["loss"]), 0, name="check.avg"))
    expect(root == averaged["loss"], f"averaged loss differs between ranks: {root} vs {averaged['loss']}")


def case_warmup() -> None:
    """LearningRateWarmupCallback: Horovod's per-batch ramp from lr/size to lr; SGD velocity scaled."""
    import keras

    r, n = bps.rank(), bps.size()
    steps, epochs, lr = 4, 3, 0.2
    model = make_keras(1)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
    _compile(model, opt)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate))

    xs, ys = zip(*(batch(r, s) for s in range(steps)))
    warm = hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2, verbose=0)
    model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), warm, Record()])
    want = [lr / n * ((e + b / steps) * (n - 1) / 2 + 1) if e + b / steps < 2 else lr
            for e in range(epochs) for b in range(steps)]
    close("warm-up learning rates", seen, want)

    # momentum correction: the velocity is rescaled with the rate (v already contains lr in Keras 3)
    m = make_keras(1)
    o = keras.optimizers.SGD(1.0, momentum=0.9)
    _compile(m, o)
    m.fit(*batch(r, 0), batch_size=B, epochs=1, verbose=0)
    before = [v.numpy().copy() for v in o.momentums]
    cb = hvd.callbacks.LearningRateWarmupCallback(initial_lr=1.0, warmup_epochs=1, steps_per_epoch=2)
    cb.set_model(m)
    cb.on_train_begin()
    cb.on_epoch_begin(0)
    cb.on_train_batch_begin(0)
    for a, b in zip(o.momentums, before):
        close("momentum correction", a.numpy(), b * (1.0 / n))


def case_v1() -> None:
    """A TF1 graph: DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer) with the broadcast hook
    matches the reference."""
    r = bps.rank()
    ref = tape_reference()
    g = tf.Graph()
    with g.as_default():
        vs = make_vars(r + 1)
        x = tf.compat.v1.placeholder(tf.float32, (None, D_IN))
        y = tf.compat.v1.placeholder(tf.int64, (None,))
        opt = bps.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), name="v1")
        train = opt.minimize(loss_fn(vs, x, y), var_list=vs)
        hook = bps.BroadcastGlobalVariablesHook(0)
        hook.begin()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            hook.after_create_session(sess, None)
            for s in range(STEPS):
                xb, yb = batch(r, s)
                sess.run(train, {x: xb, y: yb})
            got = sess.run(vs)
    for i, (a, b) in enumerate(zip(got, ref)):
        close(f"TF1 DistributedOptimizer variable {i}", a, b)


def case_graph() -> None:
    """In the traced graph each push's start op is fed by its own gradient only (so it can run while
    the backward pass goes on) and the starts are chained in backward order."""
    from pushpull.tensorflow import ops as tfops

    vs = make_vars(1)
    real = tfops.distributed
    tfops.distributed = lambda: True  # trace the distributed path; the function is never run
    try:
        @tf.function
        def grads(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(vs, x, y)
            return bps.DistributedGradientTape(tape, name="g").gradient(loss, vs)

        graph = grads.get_concrete_function(tf.TensorSpec((None, D_IN)), tf.TensorSpec((None,), tf.int64)).graph
    finally:
        tfops.distributed = real
    starts = [op for op in graph.get_operations() if op.name.startswith("pushpull_start")]
    expect(len(starts) == 4, f"{len(starts)} start ops")
    for op in starts:
        expect(len(op.inputs) == 1 and op.inputs[0].op.name.startswith("gradient_tape"),
               f"{op.name} is fed by {[i.op.name for i in op.inputs]}")
        expect(all(c.name.startswith("pushpull_start") for c in op.control_inputs),
               f"{op.name} waits for {[c.name for c in op.control_inputs]}")
    # the first start (no control input) is the last layer's gradient: b2's
    first = [op for op in starts if not op.control_inputs]
    expect(len(first) == 1 and first[0].inputs[0].shape.as_list() == [D_OUT], "first start is not b2's")


def diloco_reference(start: list, h: int, frags: list, total: int, lr: float = 0.1) -> tuple[list, list, list]:
    """DiLoCo computed here for every rank: plain SGD inner steps on each rank's batches, the mean
    pseudo-gradient, Nesterov SGD (lr 0.7, momentum 0.9) on the global parameters; fragment f (a list of
    variable indices) has its rounds at the steps f * h // len(frags) + k * h. Returns the global parameters
    and this rank's variables after ``total`` steps, and the global parameters after a final sync()."""
    n = bps.size()
    glob, buf = [a.astype(np.float64) for a in start], [None] * len(start)
    locs = [[a.copy() for a in start] for _ in range(n)]

    def outer(idx):
        for i in idx:
            g = np.mean([glob[i] - locs[q][i] for q in range(n)], axis=0)
            buf[i] = g if buf[i] is None else 0.9 * buf[i] + g
            glob[i] = glob[i] - 0.7 * (g + 0.9 * buf[i])
            for q in range(n):
                locs[q][i] = glob[i].astype(np.float32)

    last = [0] * len(frags)
    for s in range(1, total + 1):
        for q in range(n):
            vs = [tf.Variable(a) for a in locs[q]]
            with tf.GradientTape() as tape:
                loss = loss_fn(vs, *batch(q, s - 1))
            locs[q] = [a - lr * g.numpy() for a, g in zip(locs[q], tape.gradient(loss, vs))]
        for f, idx in enumerate(frags):
            off = s - f * h // len(frags)
            if off > 0 and off % h == 0:
                outer(idx)
                last[f] = s
    before, mine = [g.copy() for g in glob], [a.copy() for a in locs[bps.rank()]]
    if any(s != total for s in last):  # sync(): a round of every variable unless all had theirs at this step
        outer([i for idx in frags for i in idx])
    return before, mine, glob


def case_diloco() -> None:
    """bps.DiLoCo in a custom loop (2 fragments, staggered) and hvd.callbacks.DiLoCoCallback under fit == the
    rounds computed here for every rank; the final sync leaves every rank the same parameters."""
    import keras

    r = bps.rank()
    vs = make_vars(r + 1)  # each rank elsewhere: the start takes rank 0's
    start = [t.numpy() for t in make_vars(1)]
    opt = bps.DiLoCo(vs, sync_every=4, fragments=2, name="tf.diloco")
    # by size the variables make two fragments: w1 (96 values) | b1, w2, b2 (16 + 48 + 3)
    expect(opt.fragments == [[0], [1, 2, 3]], f"fragments {opt.fragments}, expected [[0], [1, 2, 3]]")
    for s in range(8):  # fragment 0's rounds at steps 4 and 8, fragment 1's (offset by H / 2) at step 6
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, *batch(r, s))
        for t, g in zip(vs, tape.gradient(loss, vs)):
            t.assign_sub(0.1 * g)
        opt.step()
    _, mine, synced = diloco_reference(start, 4, [[0], [1, 2, 3]], 8)
    expect(opt.rounds == 4, f"DiLoCo took {opt.rounds} rounds, 4 due (the start, 2 of fragment 0, 1 of fragment 1)")
    for i, (t, want) in enumerate(zip(vs, mine)):
        close(f"DiLoCo (2 fragments) variable {i} after 8 steps", t.numpy(), want, rtol=1e-4, atol=1e-5)
    opt.sync()  # fragment 1 moved on for 2 steps since its round: a round of every variable
    for i, (t, want) in enumerate(zip(vs, synced)):
        close(f"DiLoCo variable {i} after sync()", t.numpy(), want, rtol=1e-4, atol=1e-5)

    model = make_keras(r + 1)
    _compile(model, keras.optimizers.SGD(0.1))
    cb = hvd.callbacks.DiLoCoCallback(sync_every=2, name="keras.diloco")
    xs, ys = zip(*(batch(r, s) for s in range(4)))
    model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[cb])
    ref = make_keras(1)
    glob, _, _ = diloco_reference([w.numpy() for w in ref.trainable_variables], 2, [[0, 1, 2, 3]], 4)
    expect(cb.diloco.rounds == 3, f"DiLoCoCallback took {cb.diloco.rounds} rounds, 3 due (the start, 2 rounds; "
                                  f"the end's sync has nothing to do)")
    for i, (a, want) in enumerate(zip(model.get_weights(), glob)):
        close(f"DiLoCoCallback under fit, weight {i}", a, want, rtol=1e-4, atol=1e-5)


CASES = {"collectives": case_collectives, "tape": case_tape, "order": case_order, "keras": case_keras,
         "warmup": case_warmup, "v1": case_v1, "graph": case_graph, "diloco": case_diloco}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", choices=list(CASES) + ["all"])
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    for c in (list(CASES) if "all" in args.cases else args.cases):
        t = time.monotonic()
        CASES[c]()
        print(f"case {c} ok on rank {bps.rank()}/{bps.size()} in {time.monotonic() - t:.2f}s", flush=True)
    bps.shutdown()
    print("ALL-OK", flush=True)


if __name__ == "__main__":
    main()
