#!/usr/bin/env python
"""The digits example (examples/train_digits.py) in MXNet Gluon, written as a BytePS Gluon script:
only the import line differs from ``import byteps.mxnet as bps``.

    .venv-mxnet/bin/python examples/train_digits_gluon.py                  # one process
    .venv-mxnet/bin/python -m pushpull launch --workers 2 --servers 1 -- \\
        .venv-mxnet/bin/python examples/train_digits_gluon.py --min-accuracy 0.95

MXNet 1.9.1 needs NumPy < 1.24, hence its own environment (scripts/test-mxnet.sh makes .venv-mxnet).
Same data, split, CNN and schedule as the PyTorch example: scikit-learn's bundled digits, SGD with
momentum in ``bps.DistributedTrainer`` (or, with ``--kvstore``, a plain ``gluon.Trainer`` over
``mx.kvstore.create("pushpull")``, the one-line switch from ``dist_sync``), one warm-up epoch, then a
per-step cosine decay.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import pushpull.mxnet as bps  # BytePS: import byteps.mxnet as bps


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.035,
                   help="peak learning rate for one worker; multiplied by the number of workers")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--kvstore", action="store_true",
                   help='plain gluon.Trainer with kvstore=mx.kvstore.create("pushpull") instead of DistributedTrainer')
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="exit with status 1 if the final test accuracy is below this")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    return p.parse_args(argv)


def load_data(seed: int, test_fraction: float):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    tr, te = train_test_split(np.arange(len(y)), test_size=test_fraction, random_state=seed, stratify=y)
    return x[tr], y[tr].astype(np.float32), x[te], y[te].astype(np.float32)


def build_model():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, in_channels=1, activation="relu"),
            gluon.nn.Conv2D(32, 3, padding=1, in_channels=16, activation="relu"),
            gluon.nn.MaxPool2D(2),
            gluon.nn.Flatten(),
            gluon.nn.Dense(64, in_units=512, activation="relu"),
            gluon.nn.Dense(10, in_units=64))
    return net


def accuracy(net, x: np.ndarray, y: np.ndarray) -> float:
    out = net(mx.nd.array(x)).asnumpy()
    return float((out.argmax(1) == y).mean())


def main(argv=None) -> int:
    args = parse_args(argv)
    bps.init()
    rank, size = bps.rank(), bps.size()
    x_train, y_train, x_test, y_test = load_data(args.seed, args.test_fraction)
    per = math.ceil(len(y_train) / size)
    steps = math.ceil(per / args.batch_size)

    mx.random.seed(args.seed + rank)  # different on purpose: the trainer broadcasts rank 0's weights
    net = build_model()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    lr = args.lr * size
    opt_params = {"learning_rate": lr, "momentum": 0.9, "wd": 1e-4}
    if args.kvstore:
        # MXNet's dist_sync semantics: gradients are summed over workers, so step() takes the global batch;
        # Gluon broadcasts rank 0's weights at its first step, so start every worker from the same ones
        bps.broadcast_parameters(net.collect_params(), root_rank=0)
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt_params, kvstore=mx.kvstore.create("pushpull"))
        step_size = args.batch_size * size
    else:
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", opt_params)
        step_size = args.batch_size
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if rank == 0:
        print(f"digits (mxnet {mx.__version__}, {'kvstore' if args.kvstore else 'DistributedTrainer'}): "
              f"{len(y_train)} train / {len(y_test)} test images, {size} worker(s), batch {args.batch_size}/worker, "
              f"lr {lr:g}, {steps} steps/epoch", flush=True)

    total, warmup = args.epochs * steps, round(args.warmup_epochs * steps)
    history, times = [], []
    wall0 = time.perf_counter()
    for epoch in range(args.epochs):
        # one shuffle shared by all workers, padded by wrapping: equal steps, disjoint shards
        perm = np.random.default_rng(args.seed * 1000 + epoch).permutation(len(y_train))
        perm = np.concatenate([perm, perm[: per * size - len(perm)]])[rank::size]
        t0 = time.perf_counter()
        loss_sum = 0.0
        for s in range(steps):
            step = epoch * steps + s
            if step < warmup:
                f = (step + 1) / warmup
            else:
                f = 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
            trainer.set_learning_rate(lr * f)
            b = perm[s * args.batch_size:(s + 1) * args.batch_size]
            x, y = mx.nd.array(x_train[b]), mx.nd.array(y_train[b])
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(step_size if args.kvstore else len(b))
            loss_sum += float(loss.sum().asscalar())
        dt = time.perf_counter() - t0
        train_loss = float(bps.allreduce(mx.nd.array([loss_sum / len(perm)]), name="digits.loss").asscalar())
        acc = accuracy(net, x_test, y_test)  # identical weights on every worker: the whole test split
        history.append(round(acc, 4))
        times.append(dt)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train_loss={train_loss:.4f} test_accuracy={acc:.4f} "
                  f"throughput={per * size / dt:.0f} samples/s", flush=True)
    wall = time.perf_counter() - wall0
    acc = history[-1]
    throughput = per * size * len(times) / sum(times)
    summary = {"test_accuracy": acc, "accuracy_history": history, "epochs": args.epochs, "workers": size,
               "throughput": round(throughput, 1), "wall_s": round(wall, 2), "lr": lr, "seed": args.seed,
               "framework": f"mxnet-{mx.__version__}", "kvstore": args.kvstore}
    bps.shutdown()
    if rank == 0:
        print(f"final: test_accuracy={acc:.4f} epochs={args.epochs} throughput={throughput:.0f} samples/s "
              f"workers={size} wall={wall:.1f}s", flush=True)
        if args.json:
            print(json.dumps(summary), flush=True)
    if args.min_accuracy is not None and acc < args.min_accuracy:
        print(f"rank {rank}: test accuracy {acc:.4f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr,
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
