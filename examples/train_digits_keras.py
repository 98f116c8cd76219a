#!/usr/bin/env python
"""The digits example (examples/train_digits.py) in Keras 3, written as a Horovod Keras script:
only the import line differs from ``import horovod.tensorflow.keras as hvd``.

    python examples/train_digits_keras.py                  # one process
    pushpull launch --workers 2 --servers 1 -- python examples/train_digits_keras.py --min-accuracy 0.95

scikit-learn's bundled handwritten digits (no download), the same split and
the same small CNN as the PyTorch example, SGD with momentum wrapped in
``hvd.DistributedOptimizer``, Horovod's callbacks (broadcast of the initial
state, metric averaging, learning-rate warm-up) and a per-step cosine decay.
Each worker trains on its own shard of the training split, padded by wrapping
so that every worker takes the same number of steps.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import pushpull.tensorflow.keras as hvd  # noqa: E402  (Horovod: import horovod.tensorflow.keras as hvd)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.035,
                   help="peak learning rate for one worker; multiplied by the number of workers")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="exit with status 1 if the final test accuracy is below this")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--threads", type=int, default=None, help="TensorFlow threads per worker (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no per-step progress bar")
    return p.parse_args(argv)


def load_data(seed: int, test_fraction: float):
    """The PyTorch example's split: same images, same held-out set (NHWC instead of NCHW)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x.astype(np.float32) / 16.0).reshape(-1, 8, 8, 1)
    tr, te = train_test_split(np.arange(len(y)), test_size=test_fraction, random_state=seed, stratify=y)
    return x[tr], y[tr], x[te], y[te]


def build_model(keras):
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def main(argv=None) -> int:
    args = parse_args(argv)
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "1"))
    import tensorflow as tf
    import keras

    # several workers share this machine's cores: one thread each (as the PyTorch example)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = load_data(args.seed, args.test_fraction)
    # this worker's shard, padded by wrapping so every worker has the same number of steps
    per = math.ceil(len(y_train) / size)
    order = np.random.default_rng(args.seed).permutation(len(y_train))
    order = np.concatenate([order, order[: per * size - len(order)]])
    mine = order[rank::size]
    x_mine, y_mine = x_train[mine], y_train[mine]
    steps = math.ceil(per / args.batch_size)

    keras.utils.set_random_seed(args.seed + rank)  # different on purpose: the broadcast callback equalises
    model = build_model(keras)
    lr = args.lr * size  # Horovod: scale the learning rate by the number of workers
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=lr, momentum=0.9, weight_decay=1e-4))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    total, warmup = args.epochs * steps, round(args.warmup_epochs * steps)

    class CosineAfterWarmup(keras.callbacks.Callback):
        """Per-step cosine decay to 0 by the last step, once the warm-up callback is done."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            step = self.epoch * steps + batch
            if step >= warmup:
                t = (step - warmup) / max(1, total - warmup)
                self.model.optimizer.learning_rate = lr * 0.5 * (1.0 + math.cos(math.pi * t))

    class EpochLine(keras.callbacks.Callback):
        """Rank 0's line per epoch (after MetricAverageCallback, so the numbers are every worker's mean)."""

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            dt = time.perf_counter() - self.t0
            times.append(dt)
            history.append(round(float(logs["val_accuracy"]), 4))
            if rank == 0:
                print(f"epoch {epoch + 1}/{args.epochs}: train_loss={logs['loss']:.4f} "
                      f"test_loss={logs['val_loss']:.4f} test_accuracy={logs['val_accuracy']:.4f} "
                      f"throughput={per * size / dt:.0f} samples/s", flush=True)

    times: list[float] = []
    history: list[float] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=args.warmup_epochs,
                                                 steps_per_epoch=steps),
        CosineAfterWarmup(),
        EpochLine(),
    ]
    if rank == 0:
        print(f"digits (keras {keras.__version__}, backend {keras.backend.backend()}): {len(y_train)} train / "
              f"{len(y_test)} test images, {size} worker(s), batch {args.batch_size}/worker, lr {lr:g}, "
              f"{steps} steps/epoch", flush=True)
    wall0 = time.perf_counter()
    # every worker scores the whole (small) held-out split with identical weights
    model.fit(x_mine, y_mine, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
              validation_data=(x_test, y_test), callbacks=callbacks,
              verbose=1 if rank == 0 and not args.no_progress and sys.stdout.isatty() else 0)
    wall = time.perf_counter() - wall0
    acc = history[-1]
    throughput = per * size * len(times) / sum(times) if times else 0.0
    summary = {"test_accuracy": acc, "accuracy_history": history, "epochs": args.epochs, "workers": size,
               "throughput": round(throughput, 1), "wall_s": round(wall, 2), "lr": lr, "seed": args.seed,
               "framework": f"keras-{keras.__version__}-{keras.backend.backend()}"}
    hvd.shutdown()
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
