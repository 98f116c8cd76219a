"""The gradient noise scale of the DiLoCo quality benchmark's language model: how far each worker's batch is from
the batch at which more windows per step stop paying.

    flock /tmp/pushpull-cpu.lock python benchmarks/noise_scale.py [--n-embd 384 --n-layer 6 --n-head 6]
        [--steps 2000 --batch 32 --lr 0.0003] [--small 8 --draws 64] [--measure-at 0,100,500,1000,2000]
        [--out docs/results/noise_scale_10m.md]

The simple noise scale of McCandlish et al. ("An Empirical Model of Large-Batch Training", arXiv 1812.06162):
B_noise = tr(Σ) / |G|², with G the true gradient and Σ the covariance of one window's gradient. Far below it
a step's gradient is mostly noise, and a batch k times larger makes nearly k times the progress per step; far
above it, a larger batch adds nothing. Why DiLoCo cares: a synchronous step of M workers uses M times each
worker's batch, a DiLoCo worker steps on its own batch alone; if that batch were far below B_noise, one
synchronous step would be worth several of a worker's, and the outer average would have that much to make up
for (DiLoCo's published runs give each worker 512 sequences of 1,024 tokens). docs/diloco.md sets these figures
beside DiLoCo runs whose workers' batches span 0.06 to about 2 times B_noise: what DiLoCo is worth did not move.

One process trains the benchmark's model as the synchronous run does (``--batch`` windows of 128 bytes per
step, the synchronous run's global batch; AdamW with the same 5 % warm-up and constant rate, bf16 autocast), on
the same training text. At each step of ``--measure-at`` it takes the held-out loss (the same fixed windows as
the quality benchmark) and the gradients of ``--draws`` independent batches of ``--small`` windows at the
current parameters. The unbiased estimators (the paper's appendix A): with |g|² averaged over the small
batches and |ḡ|² the squared norm of their mean (a batch of draws x small windows),
|G|² = (B_big |ḡ|² - B_small mean |g|²) / (B_big - B_small) and tr(Σ) = (mean |g|² - |ḡ|²) / (1/B_small -
1/B_big); B_noise is their ratio, with a jackknife standard error over the draws. It is printed in windows
and in tokens (bytes), beside each DiLoCo worker's batch and the synchronous step's.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import time
from pathlib import Path

_QUALITY = Path(__file__).resolve().parent / "diloco_quality.py"
_spec = importlib.util.spec_from_file_location("diloco_quality", _QUALITY)
dq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dq)  # the quality benchmark's corpus, model and windows: the same text and model


def noise_scale(gram, small: int) -> dict:
    """B_noise (in windows) from the Gram matrix of ``draws`` gradients of ``small`` windows each.

    ``gram[i][j]`` = g_i . g_j (a float64 tensor, draws x draws). Returns the true gradient's squared norm, the
    trace of one window's gradient covariance, their ratio B_noise, and its jackknife standard error (None for
    fewer than 3 draws). B_noise is None where the |G|² estimate is not positive: the draws together are still
    too few windows to see the gradient through the noise."""
    k = gram.shape[0]
    if k < 2:
        raise ValueError(f"noise_scale: {k} draw(s); the estimator needs at least 2")

    def estimate(diag_sum, total, n):
        b_small, b_big = small, small * n
        per_draw = diag_sum / n  # mean |g_i|^2
        of_mean = total / n ** 2  # |mean g_i|^2
        g2 = (b_big * of_mean - b_small * per_draw) / (b_big - b_small)
        trace = (per_draw - of_mean) / (1 / b_small - 1 / b_big)
        return g2, trace, (trace / g2 if g2 > 0 else None)

    diag = gram.diagonal()
    rows = gram.sum(dim=1)
    diag_sum, total = float(diag.sum()), float(gram.sum())
    g2, trace, b = estimate(diag_sum, total, k)
    se = None
    if k >= 3 and b is not None:
        loo = [estimate(diag_sum - float(diag[i]), total - 2 * float(rows[i]) + float(diag[i]), k - 1)[2]
               for i in range(k)]
        if all(x is not None for x in loo):
            mean = sum(loo) / k
            se = math.sqrt((k - 1) / k * sum((x - mean) ** 2 for x in loo))
    return {"g2": g2, "trace": trace, "b_noise": b, "b_noise_se": se}


def measure(m, text, small: int, draws: int, gen, autocast) -> dict:
    """The gradients of ``draws`` independent batches of ``small`` random windows at the model's current
    parameters (the parameters and their .grad left as they were), and their noise scale."""
    import torch

    params = [p for p in m.parameters() if p.requires_grad]
    saved = [None if p.grad is None else p.grad.clone() for p in params]
    flat = []
    for _ in range(draws):
        for p in params:
            p.grad = None
        x = dq.windows(text, torch.randint(0, len(text) - dq.CONTEXT - 1, (small,), generator=gen))
        with autocast:
            loss = m(input_ids=x, labels=x).loss
        loss.backward()
        flat.append(torch.cat([p.grad.reshape(-1).float() for p in params]))
    for p, g in zip(params, saved):
        p.grad = g
    v = torch.stack(flat)
    return noise_scale((v @ v.T).double(), small)


def run(args) -> tuple[list[dict], int]:
    import torch

    torch.set_num_threads(args.threads)
    train, held = dq.corpus()
    train_t = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
    held_t = torch.frombuffer(bytearray(held), dtype=torch.uint8).long()
    torch.manual_seed(0)
    m = dq.model(args)
    opt = torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: dq.rate(s, args.steps, "constant"))
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())
    at = sorted({int(s) for s in args.measure_at.split(",")})
    if at[-1] > args.steps:
        raise SystemExit(f"--measure-at {at[-1]} is past --steps {args.steps}")
    data_gen = torch.Generator().manual_seed(1000)
    probe_gen = torch.Generator().manual_seed(2000)
    rows, t0 = [], time.monotonic()
    for step in range(args.steps + 1):
        if step in at:
            r = {"step": step, "held_out_loss": dq.held_out_loss(m, held_t, args.eval_windows, autocast),
                 **measure(m, train_t, args.small, args.draws, probe_gen, autocast)}
            rows.append(r)
            b = r["b_noise"]
            print(f"step {step}: held-out {r['held_out_loss']:.4f}, B_noise "
                  + (f"{_num(b)} windows ({_num(b * dq.CONTEXT)} tokens)" if b is not None else "not resolved")
                  + f" [{time.monotonic() - t0:.0f} s]", flush=True)
        if step == args.steps:
            break
        x = dq.windows(train_t, torch.randint(0, len(train_t) - dq.CONTEXT - 1, (args.batch,), generator=data_gen))
        with autocast:
            loss = m(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return rows, sum(p.numel() for p in m.parameters())


def _num(x: float) -> str:
    """Three significant figures at most, thousands separated: B_noise runs from below a window to thousands."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def report(args, rows: list[dict], params: int) -> str:
    """The results page: B_noise along training, beside each DiLoCo worker's batch and the synchronous step's."""
    worker = args.batch // args.workers
    cmd = (f"`flock /tmp/pushpull-cpu.lock python benchmarks/noise_scale.py --n-embd {args.n_embd} --n-layer "
           f"{args.n_layer} --n-head {args.n_head} --steps {args.steps} --batch {args.batch} --workers {args.workers} "
           f"--lr {args.lr} --precision {args.precision} --small {args.small} --draws {args.draws} --measure-at "
           f"{args.measure_at}" + (f" --eval-windows {args.eval_windows}" if args.eval_windows != 256 else "")
           + (f" --out {args.out}" if args.out else "") + "`")
    lines = [
        f"# The gradient noise scale of the DiLoCo benchmark's model ({params / 1e6:.1f} M parameters)", "",
        f"{cmd}", "",
        f"One process trains as the synchronous run of `diloco_quality.py --workers {args.workers} --batch "
        f"{worker}` does: {args.batch} windows of {dq.CONTEXT} bytes a step, AdamW {args.lr} (5 % warm-up, then "
        f"constant), {args.precision}. At each step below: the held-out loss (nats per byte, the quality "
        f"benchmark's {args.eval_windows} windows) and the simple noise scale B_noise = tr(Σ)/|G|² (McCandlish "
        f"et al., arXiv 1812.06162) from {args.draws} independent batches of {args.small} windows "
        f"({args.draws * args.small} windows in all), ± its jackknife standard error. A DiLoCo worker's batch is "
        f"{worker} windows ({worker * dq.CONTEXT:,} tokens), the synchronous step's {args.batch} "
        f"({args.batch * dq.CONTEXT:,}). In the paper's model a step on B windows makes 1/(1 + B_noise/B) of "
        f"the progress of a step on the true gradient: the last two columns.", "",
        "| step | held-out loss | B_noise, windows | B_noise, tokens | worker's batch / B_noise | "
        "a worker's step | a synchronous step |",
        "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b, se = r["b_noise"], r["b_noise_se"]
        if b is None or b <= 0:
            lines.append(f"| {r['step']} | {r['held_out_loss']:.4f} | not resolved (|G|² or tr(Σ) ≤ 0) | | | | |")
            continue
        lines.append(f"| {r['step']} | {r['held_out_loss']:.4f} | {_num(b)}" + (f" ± {_num(se)}" if se else "")
                     + f" | {_num(b * dq.CONTEXT)} | {_num(worker / b)} | {1 / (1 + b / worker):.2f} | "
                       f"{1 / (1 + b / args.batch):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--steps", type=int, default=2000, help="training steps (the last --measure-at at most)")
    p.add_argument("--batch", type=int, default=32,
                   help="windows per training step: the synchronous run's global batch")
    p.add_argument("--workers", type=int, default=4, help="the quality benchmark's workers: a worker's batch is "
                                                          "--batch / --workers")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--small", type=int, default=8, help="windows per draw")
    p.add_argument("--draws", type=int, default=64, help="independent draws per measurement")
    p.add_argument("--measure-at", default="0,100,500,1000,2000")
    p.add_argument("--eval-windows", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="the results page (markdown, and .json beside it)")
    args = p.parse_args(argv)
    if args.draws < 3 or args.small < 1 or args.batch % args.workers:
        raise SystemExit("--draws must be at least 3, --small at least 1, and --batch a multiple of --workers")
    rows, params = run(args)
    text = report(args, rows, params)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"args": vars(args), "params": params,
                                                                   "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
