"""A worker's memory over the steps, against the same training in one process without pushpull.

    python benchmarks/worker_memory.py [--workers 2] [--n-embd 512 --n-layer 9 --n-head 8] [--steps 60]
        [--out docs/results/worker_memory.md]

Why: each push_pull holds its gradient and output until it completes; if anything keeps an operation alive
after that (until 2026-12-08, a reference cycle through the handle's closures did, until Python's cyclic
collector ran), every step's gradients pile up: 2 workers of a 28.5 M-parameter GPT-2 grew to 3.9 GB each by
step 60 and kept growing, and 4 of them were OOM-killed in 24 GB. The bound is the process without pushpull
(the model, AdamW's state and the activations) plus pushpull's own buffers, which do not grow with the steps.

The model is the DiLoCo quality benchmark's GPT-2 (byte level, context 128), 8 random windows per step, AdamW,
bf16 autocast, one thread per process. First one process trains it alone (plain PyTorch, no pushpull: the peer),
then ``--workers`` processes under ``pushpull launch`` with ``DistributedOptimizer``; each prints its resident
set (``/proc/self/statm``) every ``--every`` steps. The page gives each figure beside the peer's, the model's
fp32 size M, and the growth from the first printed step to the last (flat is the goal).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def train(args, distributed: bool) -> None:
    import torch

    if distributed:  # register before the slow import of transformers
        import pushpull.torch as bps

        bps.init()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=128, n_embd=args.n_embd, n_layer=args.n_layer,
                                       n_head=args.n_head, bos_token_id=0, eos_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    rank = 0
    if distributed:
        rank = bps.rank()
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    params = sum(p.numel() for p in model.parameters())
    for step in range(args.steps + 1):
        x = torch.randint(0, 256, (8, 128))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.every == 0:
            print("MEMORY " + json.dumps({"rank": rank, "distributed": distributed, "step": step, "rss_mb": rss_mb(),
                                          "params": params}), flush=True)


def run(argv: list[str], env: dict | None = None) -> list[dict]:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PUSHPULL_REGISTER_TIMEOUT": "120", **(env or {})})
    out = res.stdout + res.stderr
    if res.returncode != 0:
        sys.exit(f"worker_memory: {' '.join(argv[:6])} ... failed:\n{out[-3000:]}")
    return [json.loads(m) for m in re.findall(r"MEMORY (\{.*\})", out)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--n-layer", type=int, default=9)
    ap.add_argument("--n-head", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", choices=["plain", "pushpull"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        train(args, args.worker == "pushpull")
        return
    model_args = ["--n-embd", str(args.n_embd), "--n-layer", str(args.n_layer), "--n-head", str(args.n_head),
                  "--steps", str(args.steps), "--every", str(args.every)]
    me = [sys.executable, str(Path(__file__).resolve())]
    plain = run(me + model_args + ["--worker", "plain"])
    workers = run([sys.executable, "-m", "pushpull", "launch", "--workers", str(args.workers), "--servers", "1",
                   "--"] + me + model_args + ["--worker", "pushpull"])
    params = plain[0]["params"]
    model_mb = params * 4 / 2**20
    steps = sorted({r["step"] for r in plain})
    lines = [f"# A worker's memory over the steps: {args.workers} workers against one process without pushpull",
             "", f"`python benchmarks/worker_memory.py --workers {args.workers} --n-embd {args.n_embd} --n-layer "
             f"{args.n_layer} --n-head {args.n_head} --steps {args.steps}`: a GPT-2 of {params / 1e6:.1f} M "
             f"parameters (M = {model_mb:.0f} MB of fp32), 8 windows of 128 bytes per step, AdamW, bf16 autocast; "
             "resident set of each process (MB).", "",
             "| step | one process, no pushpull | pushpull workers (each) | extra per worker | extra / M |",
             "|---:|---:|---:|---:|---:|"]
    for s in steps:
        p = next(r["rss_mb"] for r in plain if r["step"] == s)
        w = sorted(r["rss_mb"] for r in workers if r["step"] == s)
        lines.append(f"| {s} | {p:,} | {', '.join(f'{x:,}' for x in w)} | {max(w) - p:+,} | "
                     f"{(max(w) - p) / model_mb:.1f} |")
    first, last = steps[1] if len(steps) > 1 else steps[0], steps[-1]
    grow = [max(r["rss_mb"] for r in workers if r["step"] == s) for s in (first, last)]
    grow_plain = [next(r["rss_mb"] for r in plain if r["step"] == s) for s in (first, last)]
    lines += ["", f"From step {first} to {last}: the workers {grow[1] - grow[0]:+,} MB, the process without "
              f"pushpull {grow_plain[1] - grow_plain[0]:+,} MB (flat is the goal: what pushpull holds does not "
              "grow with the steps)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
