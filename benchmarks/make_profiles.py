"""Regenerate the profiles shipped in ``pushpull/data/profiles``.

Two kinds of profile per model:

* ``<model>.json`` — measured on this machine's CPU with a small batch when a
  run fits the budget (``--budget`` seconds per model), otherwise shape-derived
  for a V100-class GPU (``source: "shapes"``, ``device: "synthetic-v100"``).
  BERT-large is always shape-derived: one CPU step of it takes 10-40 s on the
  shared 2-core development machine, too slow and too noisy to be worth it;
* ``<model>_v100.json`` — always shape-derived for a V100-class GPU at the
  batch size of the papers (32 images / 32 sequences of 128 tokens), so that the
  simulator has GPU-like compute-to-communication ratios out of the box.

Usage::

    python benchmarks/make_profiles.py                 # all models
    python benchmarks/make_profiles.py --only resnet50 --threads 2
    python benchmarks/make_profiles.py --synthetic     # no CPU measurement
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from pushpull.bench.profile_cli import estimate_profile, measure
from pushpull.profiles import BUILTIN_DIR

log = logging.getLogger("make_profiles")

# model -> (CPU batch size, measured steps, warm-up steps), None = shapes only.
# Sequence models use 128 tokens. Chosen so that one model takes well under two
# minutes on 2 cores.
CPU_PLAN = {
    "resnet50": (8, 3, 1),
    "vgg16": (4, 3, 1),
    "bert_base": (4, 3, 1),
    "gpt2": (4, 3, 1),
    "bert_large": None,
}
GPU_BATCH = 32


def _one_step_seconds(name: str, batch: int) -> float:
    """Cost of one un-hooked step, to decide whether measuring fits the budget."""
    from pushpull.bench.models import build_model, example_batch

    model = build_model(name)
    b, loss_fn = example_batch(name, batch)
    t = time.perf_counter()
    loss_fn(model, b).backward()
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=list(CPU_PLAN), help="models to regenerate")
    ap.add_argument("--out-dir", default=str(BUILTIN_DIR))
    ap.add_argument("--synthetic", action="store_true", help="shape-derived profiles only")
    ap.add_argument("--v100-only", action="store_true", help="regenerate only the <model>_v100.json files")
    ap.add_argument("--budget", type=float, default=120.0, help="max seconds of CPU measurement per model")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        plan = CPU_PLAN[name]
        syn = estimate_profile(name, GPU_BATCH)
        syn.save(out / f"{name}_v100.json")
        log.info("%s_v100: fwd %.1f ms bwd %.1f ms (shapes, batch %d)", name, syn.fwd_s * 1e3,
                 syn.bwd_s * 1e3, GPU_BATCH)
        if args.v100_only:
            continue
        prof = None
        if plan is not None and not args.synthetic:
            bs, steps, warm = plan
            one = _one_step_seconds(name, bs)
            need = one * (steps + warm + 1)
            if need <= args.budget:
                t = time.perf_counter()
                prof = measure(name, bs, steps=steps, warmup=warm)
                log.info("%s: measured on cpu, batch %d, in %.0f s", name, bs, time.perf_counter() - t)
            else:
                log.info("%s: one CPU step takes %.1f s, %d steps would exceed the %.0f s budget; "
                         "using the shape-derived profile", name, one, steps + warm, args.budget)
        if prof is None:
            prof = syn
        prof.save(out / f"{name}.json")
        log.info("%s: %d layers, %d tensors, %d params, fwd %.3f s bwd %.3f s (%s, batch %d, %s)",
                 name, len(prof.layers), sum(len(l.tensors) for l in prof.layers), prof.numel,
                 prof.fwd_s, prof.bwd_s, prof.device, prof.batch_size, prof.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
