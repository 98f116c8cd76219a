"""Compression on a slow link: time and accuracy of the real training example
(sklearn digits CNN, `examples/train_digits.py`) per compressor, 2 worker hosts
with colocated servers on an emulated 100 Mbit/s network.

    python benchmarks/compression_slow_link.py [--rate 100mbit] [--epochs 5] [--out docs/results/compression_slow_link.md]

The seed reproduction (BytePS's gradient-compression guide) measured time and
accuracy per compressor on real clusters; here the link is emulated (network
namespaces + tbf), the model is small, and everything runs on one 2-core VM,
so read the times as relative. ``min_compress_bytes`` is 1024, as in the
accuracy table: everything but the biases and the first convolution (0.7 % of
the bytes) is compressed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from pushpull.emulate import EmulatedCluster
from pushpull.emulate.jobs import launch_job

ROOT = Path(__file__).resolve().parents[1]

# name -> extra flags of the example; every row at the example's defaults, as the accuracy table
EF_NESTEROV = ["--ef", "vanilla", "--momentum", "nesterov"]
SETTINGS = {
    "baseline": [],
    "fp16": ["--compression", "fp16"],
    "onebit+EF+nesterov": ["--compression", "onebit", *EF_NESTEROV],
    "topk 1%+EF+nesterov": ["--compression", "topk", "--k", "0.01", *EF_NESTEROV],
    "randomk 10%+EF+nesterov": ["--compression", "randomk", "--k", "0.1", *EF_NESTEROV],
    "dithering s=2": ["--compression", "dithering", "--k", "2"],
}


def run(cluster: EmulatedCluster, name: str, flags: list[str], epochs: int, log_root: Path) -> dict:
    argv = [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", str(epochs), "--json",
            "--no-progress", "--min-compress-bytes", "1024", *flags]
    t0 = time.monotonic()
    job = launch_job(cluster, 2, 2, argv, env={"OMP_NUM_THREADS": "1"}, log_dir=log_root / name.replace(" ", "_"))
    job.wait(600)
    wall = time.monotonic() - t0
    out = job["worker0"].tail(200_000).strip().splitlines()
    result = next(json.loads(ln[ln.index("{"):]) for ln in reversed(out) if "{" in ln and "test_accuracy" in ln)
    result.update({"setting": name, "job_wall_s": wall, "emulated": cluster.emulated})
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100mbit,10mbit", help="comma-separated link rates, one table each")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "compression_slow_link.md"))
    args = p.parse_args(argv)
    log_root = Path("/tmp/pushpull-compression-slow-link")
    all_rows = []
    md = ["# Compression on a slow link", "",
          f"`python benchmarks/compression_slow_link.py --rate {args.rate} --epochs {args.epochs}`: the digits CNN "
          f"(`examples/train_digits.py`), 2 worker hosts with colocated servers, {args.epochs} epochs, seed 0, "
          "`min_compress_bytes` 1024, the example's default learning-rate schedule for every row. One run per "
          "row on the shared 2-core VM.", ""]
    for rate in args.rate.split(","):
        rows = []
        with EmulatedCluster(2, rate=rate) as cluster:
            for name, flags in tqdm(SETTINGS.items(), desc=f"compressors at {rate}", unit="run"):
                rows.append(dict(run(cluster, name, flags, args.epochs, log_root / rate), rate=rate))
        all_rows += rows
        base = rows[0]
        md += [f"## {rate} ({'network namespaces + tbf' if base['emulated'] else 'LOOPBACK FALLBACK, no shaping'})",
               "",
               "| compressor | test accuracy | Δ pp | training time s | speedup | wire bytes/step |",
               "|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            md.append(f"| {r['setting']} | {100 * r['test_accuracy']:.2f} % | "
                      f"{100 * (r['test_accuracy'] - base['test_accuracy']):+.2f} | {r['wall_s']:.1f} | "
                      f"{base['wall_s'] / r['wall_s']:.2f}x | {r['bytes_per_step']:,.0f} |")
        md.append("")
    Path(args.out).with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in all_rows))
    md += ["Published (BytePS docs, CIFAR-100 ResNet-18, 4 machines at 100 Mbit/s): baseline 518 s, onebit "
           "195 s (2.7x), randomk 90 s, topk 84 s (6.2x). Training time above is the example's own timer "
           "(training loop only, rank 0)."]
    Path(args.out).write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
