#!/usr/bin/env python
"""Data-parallel training on real data with pushpull: scikit-learn's bundled
handwritten digits (1797 8x8 images, no download), a small CNN, SGD with
momentum wrapped in pushpull's DistributedOptimizer.

    python examples/train_digits.py                       # one process
    pushpull launch --workers 2 --servers 1 -- python examples/train_digits.py --min-accuracy 0.95

Each worker trains on its own shard of the training split (re-shuffled every
epoch with the same seed on every worker, so the shards never overlap); the
held-out split is fixed by ``--seed``. Rank 0 shows the progress bar; every
rank prints the same per-epoch line (the numbers are reduced over workers).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import pushpull.torch as bps


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.035,
                   help="peak learning rate for one worker; multiplied by the number of workers (linear scaling)")
    p.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine",
                   help="after the warm-up: cosine decay to 0 by the last step, or constant")
    p.add_argument("--warmup-epochs", type=float, default=1.0,
                   help="linear warm-up from lr/steps to the peak lr, per step (0: none)")
    p.add_argument("--sgd-momentum", type=float, default=None,
                   help="the optimizer's momentum (default 0.9; 0 with --momentum nesterov, which moves "
                        "momentum into the worker's compression chain as BytePS does)")
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--strategy", default=None,
                   help="communication strategy (default: PUSHPULL_STRATEGY, 'wfbp')")
    p.add_argument("--compression", default="none",
                   help="gradient compressor: none, fp16, onebit, topk, randomk, dithering")
    p.add_argument("--ef", default=None, help="error feedback: none | vanilla")
    p.add_argument("--momentum", default=None, help="compression momentum: none | nesterov")
    p.add_argument("--mu", type=float, default=None, help="momentum factor for --momentum nesterov")
    p.add_argument("--k", type=float, default=None, help="topk/randomk: count (>=1) or fraction; dithering: levels")
    p.add_argument("--no-scaling", action="store_true", help="onebit: decode to +-1 instead of +-mean(|x|)")
    p.add_argument("--partition", default=None, help="dithering levels: linear | natural")
    p.add_argument("--normalize", default=None, help="dithering scale: max | l2")
    p.add_argument("--compression-seed", type=int, default=None,
                   help="randomk/dithering seed, the same on every worker (randomk default: --seed, so all "
                        "workers pick the same indices; dithering default: random)")
    p.add_argument("--min-compress-bytes", type=int, default=None,
                   help="tensors smaller than this are sent uncompressed (default: BYTEPS_MIN_COMPRESS_BYTES, "
                        "65536); most of this small CNN's tensors are below the default")
    p.add_argument("--asynchronous", action="store_true",
                   help="asynchronous training: each worker steps on its own gradients and pushes the change "
                        "to the servers' parameters (no worker waits for another); lr is not scaled by workers")
    p.add_argument("--diloco", type=int, default=None, metavar="H",
                   help="DiLoCo: each worker takes H steps of its own optimizer alone, then the servers average "
                        "the workers' parameter changes and take an outer Nesterov step (docs/diloco.md); lr is "
                        "not scaled by workers")
    p.add_argument("--outer-lr", type=float, default=0.3,
                   help="DiLoCo's outer learning rate (Nesterov momentum 0.9). The paper's 0.7 suits long inner "
                        "phases; with H = 10 this CNN reached 0.93 with it and 0.96-0.975 with 0.3 (2-3 workers)")
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="exit with status 1 if the final test accuracy is below this")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads per worker (default: OMP_NUM_THREADS, else 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def load_data(seed: int, test_fraction: float):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y, dtype=torch.int64)
    tr, te = train_test_split(range(len(y)), test_size=test_fraction, random_state=seed, stratify=y.numpy())
    return x[tr], y[tr], x[te], y[te]


def build_model(kind: str) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 32 x 4 x 4
        nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))


def shard(n: int, epoch: int, seed: int, rank: int, size: int) -> torch.Tensor:
    """This worker's indices for one epoch, like torch's DistributedSampler: one shuffle
    shared by all workers, padded by wrapping so every worker takes the same number of steps."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    total = math.ceil(n / size) * size
    perm = torch.cat([perm, perm[: total - n]])
    return perm[rank::size]


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Fraction of the peak learning rate for ``step`` (0-based) of ``total``.

    The warm-up keeps the first steps, taken from a random initialisation with
    momentum (or a compressor's error feedback) still empty, from overshooting;
    the cosine decay makes the final accuracy that of a settled model rather
    than a snapshot of a noisy constant-rate walk. Changed every step, so the
    learning-rate ratio error feedback applies stays close to 1.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    t = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * t))


def worker_momentum(args) -> bool:
    return str(args.momentum or "none").lower() == "nesterov"


def sgd_momentum(args) -> float:
    """BytePS semantics: with compression momentum on, the worker's chain applies momentum before
    compressing, and the optimizer runs without it (otherwise momentum would be applied twice)."""
    if worker_momentum(args):
        if args.sgd_momentum:
            raise SystemExit(f"--momentum nesterov applies momentum in the compression chain; "
                             f"--sgd-momentum {args.sgd_momentum} would apply it a second time (use 0)")
        return 0.0
    return 0.9 if args.sgd_momentum is None else args.sgd_momentum


def compression_from(args):
    if args.compression in (None, "", "none") and not worker_momentum(args) and args.ef in (None, "none"):
        return bps.Compression.none
    import importlib.util

    if importlib.util.find_spec("pushpull.worker.codec") is None:
        raise SystemExit(f"--compression {args.compression}: this pushpull build has no worker-side codec "
                         f"(pushpull.worker.codec) yet; run with --compression none")
    opts = {k: v for k, v in (("ef", args.ef), ("momentum", args.momentum), ("mu", args.mu), ("k", args.k),
                              ("partition", args.partition), ("normalize", args.normalize),
                              ("seed", args.compression_seed), ("min_compress_bytes", args.min_compress_bytes))
            if v is not None}
    if args.no_scaling:
        opts["scaling"] = False
    if args.compression == "randomk" and "seed" not in opts:
        # one seed on every worker (BytePS' default): all pick the same indices, so the server's
        # sum stays k-sparse and only k values travel each way
        opts["seed"] = args.seed
    if "k" in opts and float(opts["k"]).is_integer() and opts["k"] >= 1:
        opts["k"] = int(opts["k"])
    return bps.Compression.build(args.compression, **opts)


class _Lines:
    """tqdm target for logs and the launcher's line-prefixed output: one line per refresh."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip("\n")
        if s.strip():
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


def reduce_sum(values: list[float], name: str) -> list[float]:
    return bps.push_pull(torch.tensor(values, dtype=torch.float64), average=False, name=name).tolist()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, size: int) -> tuple[float, float]:
    """Accuracy and mean loss on the held-out split; each worker scores its slice."""
    model.eval()
    with torch.no_grad():
        xs, ys = x[rank::size], y[rank::size]
        out = model(xs)
        stats = [float((out.argmax(1) == ys).sum()), float(len(ys)), float(F.cross_entropy(out, ys, reduction="sum"))]
    model.train()
    correct, total, loss = reduce_sum(stats, "digits.eval")
    return correct / total, loss / total


def main(argv=None) -> int:
    args = parse_args(argv)
    bps.init()
    rank, size = bps.rank(), bps.size()
    # The model is tiny: one intra-op thread per worker is fastest, and with several
    # workers on one machine every worker's OpenMP pool spinning on all the cores made
    # training ~15x slower here (torchrun sets OMP_NUM_THREADS=1 for the same reason).
    torch.set_num_threads(args.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.compression not in (None, "", "none") and bps.engine() is None and rank == 0:
        print("note: one worker, nothing to compress (gradients never leave the process)", flush=True)

    x_train, y_train, x_test, y_test = load_data(args.seed, args.test_fraction)
    torch.manual_seed(args.seed + rank)  # different on purpose: broadcast_parameters makes them equal
    model = build_model(args.model)
    if args.diloco is not None and args.asynchronous:
        raise SystemExit("--diloco and --asynchronous are two ways of training: choose one")
    alone = args.asynchronous or args.diloco is not None  # each worker steps on its own batch
    lr_workers = 1 if alone else size  # synchronous: linear scaling with the averaged batch
    lr = args.lr * lr_workers
    momentum = sgd_momentum(args)
    compression = compression_from(args)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=1e-4)
    if args.asynchronous:
        opt = bps.AsyncOptimizer(opt, named_parameters=model.named_parameters())
    elif args.diloco is not None:
        opt = bps.DiLoCo(opt, model.named_parameters(), sync_every=args.diloco, outer_lr=args.outer_lr)
    else:
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression, strategy=args.strategy, model=model)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt.inner if args.diloco is not None else opt, root_rank=0)

    steps = math.ceil(math.ceil(len(y_train) / size) / args.batch_size)
    if rank == 0:
        print(f"digits: {len(y_train)} train / {len(y_test)} test images, {args.model}, {size} worker(s), "
              f"batch {args.batch_size}/worker, lr {lr:g} ({args.lr_schedule}, {args.warmup_epochs:g} warm-up "
              f"epochs), sgd momentum {momentum:g}, {steps} steps/epoch, "
              f"compression {compression.spec or 'none'}, "
              f"strategy {args.strategy or bps.config().strategy}", flush=True)
    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        tty = sys.stderr.isatty()
        bar = tqdm(total=args.epochs * steps, unit="step", dynamic_ncols=tty, ncols=None if tty else 80,
                   mininterval=0.2 if tty else 2.0, file=sys.stderr if tty else _Lines(sys.stdout))

    def say(text: str) -> None:
        if bar is not None:
            bar.write(text)
        else:
            print(text, flush=True)

    eng = bps.engine()
    known = set(eng.table.entries) if eng is not None else set()
    grad_entries: list = []
    wall0 = time.perf_counter()
    # Elastic (pushpull launch --min-workers M): if a worker dies, the others raise WorkersChanged, go back
    # to the last commit (the end of the last whole epoch) and redo the epoch at the new size.
    state = bps.elastic.TorchState(model, opt.inner if args.diloco is not None else opt, epoch=0, train_time=0.0, samples=0.0, acc=0.0, test_loss=0.0,
                                   history=[], step_bytes=0)

    @bps.elastic.run
    def train(state) -> None:
        nonlocal grad_entries, known
        if eng is not None and not grad_entries:  # run() has synced the state: its tensors are not gradients
            known = set(eng.table.entries)
        while state.epoch < args.epochs:
            epoch = state.epoch
            rank, size = bps.rank(), bps.size()  # read at every epoch: they change when a worker is lost
            steps = math.ceil(math.ceil(len(y_train) / size) / args.batch_size)
            total_steps, warmup = args.epochs * steps, round(args.warmup_epochs * steps)
            lr = args.lr * (1 if alone else size)
            idx = shard(len(y_train), epoch, args.seed, rank, size)
            t0 = time.perf_counter()
            pushed0 = eng.stats["bytes_pushed"] if eng is not None else 0
            loss_sum = 0.0
            for s in range(steps):
                b = idx[s * args.batch_size:(s + 1) * args.batch_size]
                for group in opt.param_groups:  # set before backward: error feedback reads it while pushing
                    group["lr"] = lr * lr_factor(epoch * steps + s, total_steps, warmup, args.lr_schedule)
                opt.zero_grad()
                loss = F.cross_entropy(model(x_train[b]), y_train[b])
                loss.backward()
                opt.step()
                loss_sum += loss.item() * len(b)
                if bar is not None:
                    bar.update(1)
            if args.diloco is not None and opt.pending:  # evaluate the global parameters, as every rank holds them
                opt.sync()
            epoch_time = time.perf_counter() - t0
            if eng is not None:  # step() waited for every pull, so every push of this epoch is counted
                state.step_bytes += eng.stats["bytes_pushed"] - pushed0
                if not grad_entries:  # the tensors first used inside the steps: the gradients
                    grad_entries = [e for name, e in eng.table.entries.items() if name not in known]
            total_loss, n, time_sum = reduce_sum([loss_sum, float(len(idx)), epoch_time], "digits.train")
            state.train_time += time_sum / size
            state.samples += n
            state.acc, state.test_loss = evaluate(model, x_test, y_test, rank, size)
            state.history = state.history + [round(state.acc, 4)]
            if bar is not None:
                bar.set_postfix(loss=f"{total_loss / n:.3f}", acc=f"{state.acc:.3f}", refresh=False)
            if rank == 0:
                say(f"epoch {epoch + 1}/{args.epochs}: train_loss={total_loss / n:.4f} "
                    f"test_loss={state.test_loss:.4f} test_accuracy={state.acc:.4f} "
                    f"throughput={n / (time_sum / size):.0f} samples/s" + (f" workers={size}" if state.resets else ""))
            state.epoch += 1
            state.commit()

    train(state)
    rank, size = bps.rank(), bps.size()
    steps = math.ceil(math.ceil(len(y_train) / size) / args.batch_size)
    total_steps = args.epochs * steps
    train_time, samples, acc, test_loss = state.train_time, state.samples, state.acc, state.test_loss
    history, step_bytes = state.history, state.step_bytes
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - wall0
    throughput = samples / train_time if train_time > 0 else 0.0
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if eng is not None:
        def nbytes(e) -> int:
            return sum(p.nbytes for p in e.parts)
        compressed_bytes = sum(nbytes(e) for e in grad_entries if e.compression)
        declared = sum(nbytes(e) for e in grad_entries)
        pushed, step_bytes_sum = reduce_sum([float(eng.stats["bytes_pushed"]), float(step_bytes)], "digits.bytes")
    else:
        compressed_bytes, declared, pushed, step_bytes_sum = 0, grad_bytes, 0.0, 0.0
    summary = {"test_accuracy": round(acc, 4), "test_loss": round(test_loss, 4), "accuracy_history": history,
               "epochs": args.epochs, "steps": total_steps, "throughput": round(throughput, 1),
               "wall_s": round(wall, 2), "workers": size, "bytes_pushed": int(pushed),
               # per worker and step, gradients only (no evaluation or logging traffic)
               "bytes_per_step": round(step_bytes_sum / size / total_steps, 1) if total_steps else 0.0,
               "grad_bytes_per_step": grad_bytes,
               "compressed_fraction": round(compressed_bytes / declared, 4) if declared else 0.0,
               "model": args.model, "compression": args.compression, "spec": compression.spec,
               "lr": lr, "lr_schedule": args.lr_schedule, "warmup_epochs": args.warmup_epochs,
               "sgd_momentum": momentum, "seed": args.seed,
               "engine_stats": dict(eng.stats) if eng is not None else None,
               "strategy": args.strategy or bps.config().strategy}
    bps.shutdown()
    if rank == 0:
        print(f"final: test_accuracy={acc:.4f} epochs={args.epochs} throughput={throughput:.0f} samples/s "
              f"workers={size} wall={wall:.1f}s bytes_pushed={int(pushed)} "
              f"bytes/step={summary['bytes_per_step']:.0f} of {grad_bytes} "
              f"compressed_fraction={summary['compressed_fraction']:.3f}", flush=True)
        if compression.spec and eng is not None and not compressed_bytes:
            print("note: no gradient was compressed: every tensor is below min_compress_bytes "
                  f"({bps.config().min_compress_bytes} unless --min-compress-bytes is given)", flush=True)
        if args.json:
            print(json.dumps(summary), flush=True)
    if args.min_accuracy is not None and acc < args.min_accuracy:
        print(f"rank {rank}: test accuracy {acc:.4f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr,
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
