"""Sparse embedding vs dense push_pull on an emulated 100 Mbit/s cluster: bytes and time per step.

    flock -x /tmp/pp.lock python benchmarks/sparse_embedding.py [--rate 100mbit] [--rows 1000000] [--dim 64]
        [--batch 10000] [--dense-steps 2] [--sparse-steps 20] [--out docs/results/sparse_embedding.md]

One job: 2 worker hosts and 2 server hosts (separate placement), every link shaped to ``--rate``. Each
worker first runs the dense baseline, a push_pull of the table's whole gradient (what
DistributedOptimizer moves for an ``nn.Embedding`` every step, ``--rows`` x ``--dim`` fp32), then
the sparse path, a SparseEmbedding of the same table: a lookup of ``--batch`` random ids (~1 % of the
rows), backward, ``step()``. Bytes per step come from the worker host's interface counters
(/proc/net/dev inside its namespace: everything on the wire, TCP/IP headers included) and from the
payload counters of the engine and of the sparse client; the ideal ratio (payload bytes of each)
stands beside them. Each path's bound is its busier direction's measured bytes over the link rate.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import numpy as np
    import torch

    import pushpull.torch as bps
    from pushpull.bench.grid_child import link_bytes

    torch.set_num_threads(1)
    bps.init()
    iface = os.environ.get("DMLC_INTERFACE", "lo")
    rows, dim = args.rows, args.dim
    res: dict = {"rank": bps.rank(), "rows": rows, "dim": dim, "batch": args.batch, "iface": iface}

    def phase(name: str, steps: int, one_step, stats) -> None:
        bps.barrier()
        rx0, tx0 = link_bytes(iface)
        s0 = dict(stats())
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            one_step()
            times.append(time.perf_counter() - t)
        bps.barrier()
        rx1, tx1 = link_bytes(iface)
        s1 = stats()
        res[name] = {"step_s": times, "rx_per_step": (rx1 - rx0) / steps, "tx_per_step": (tx1 - tx0) / steps,
                     "payload_per_step": sum(s1[k] - s0[k] for k in ("bytes_pushed", "bytes_pulled")) / steps}

    # dense: push_pull of the whole gradient of the table
    grad = torch.randn(rows, dim)
    eng = bps.engine()
    dense_step = lambda: bps.push_pull_inplace(grad, average=True, name="dense.table")  # noqa: E731
    dense_step()  # declaration and first round, not timed
    phase("dense", args.dense_steps, dense_step, lambda: eng.stats)
    del grad

    # sparse: the same table on the servers, ~1 % of its rows per batch
    emb = bps.SparseEmbedding(rows, dim, name="sparse.table", lr=0.1)
    gen = torch.Generator().manual_seed(bps.rank())
    uniq: list[int] = []

    def sparse_step() -> None:
        ids = torch.randint(0, rows, (args.batch,), generator=gen)
        uniq.append(len(torch.unique(ids)))
        emb(ids).sum().backward()
        emb.step()

    sparse_step()
    phase("sparse", args.sparse_steps, sparse_step, lambda: emb.client.stats)
    emb(torch.zeros(1, dtype=torch.int64))  # reads the last round: every push was applied
    res["sparse"]["unique_rows"] = float(np.mean(uniq[1:]))
    print("RESULT " + json.dumps(res), flush=True)
    bps.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=10_000, help="ids per batch per worker (~1 %% of the rows)")
    p.add_argument("--dense-steps", type=int, default=2)
    p.add_argument("--sparse-steps", type=int, default=20)
    p.add_argument("--congestion", default="cubic",
                   help="TCP congestion control of the emulated hosts (one in net.ipv4.tcp_allowed_congestion_control)")
    p.add_argument("--out", default=None, help="write the results page here (markdown)")
    p.add_argument("--from-json", default=None, help="rewrite the page from a saved run (the --out .json)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        args = argparse.Namespace(**{**saved["args"], "out": args.out})
        from pushpull.units import rate_bytes

        text = report(args, saved["workers"], rate_bytes(args.rate) if saved.get("emulated", True) else None,
                      saved.get("wall_s", 0.0))
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 0

    from pushpull.bench.report import write_page
    from pushpull.emulate.jobs import run_on_separate_hosts
    from pushpull.units import rate_bytes

    argv_w = [sys.executable, str(Path(__file__).resolve()), "--worker", "--rows", str(args.rows), "--dim",
              str(args.dim), "--batch", str(args.batch), "--dense-steps", str(args.dense_steps),
              "--sparse-steps", str(args.sparse_steps)]
    results, emulated, wall = run_on_separate_hosts(
        argv_w, args.rate, args.congestion, {"OMP_NUM_THREADS": "1", "PUSHPULL_TIMEOUT": "300"},
        "/tmp/pushpull-sparse-bench", args.dense_steps * 120 + 600)
    rate_Bps = rate_bytes(args.rate) if emulated else None
    text = report(args, results, rate_Bps, wall)
    print(text)
    if args.out:
        write_page(args.out, text, {"args": vars(args), "workers": results, "emulated": emulated, "wall_s": wall})
    return 0


def report(args, results: list[dict], rate_Bps: float | None, wall: float) -> str:
    rows, dim = args.rows, args.dim
    u = statistics.mean(r["sparse"]["unique_rows"] for r in results)
    # payload per worker per step: dense, the gradient up and the average down; sparse, a pull's ids up and
    # rows down, a push's ids and gradients up
    ideal_dense = 2 * rows * dim * 4
    ideal_sparse = u * (8 + 4 * dim) + u * (8 + 4 * dim)
    lines = [
        "# Sparse embedding vs dense push_pull",
        "",
        f"`flock -x /tmp/pp.lock python benchmarks/sparse_embedding.py --rate {args.rate} --rows {rows} --dim {dim} "
        f"--congestion {args.congestion} "
        f"--batch {args.batch} --dense-steps {args.dense_steps} --sparse-steps {args.sparse_steps}`: a "
        f"{rows:,} x {dim} fp32 table, 2 worker hosts, 2 server hosts (separate), every link "
        f"{args.rate if rate_Bps else 'LOOPBACK FALLBACK (no shaping)'} (TCP {args.congestion}); each batch looks "
        f"up {args.batch:,} random ids per worker ({u:,.0f} distinct rows, {100 * u / rows:.2f} % of the table). Dense: push_pull of the whole "
        f"gradient (what DistributedOptimizer moves for an nn.Embedding). Sparse: SparseEmbedding lookup + backward "
        f"+ step(), the optimizer on the servers. One run, {wall:.0f} s in all, on the shared 2-core VM.",
        "",
        "| per worker, per step | dense push_pull | sparse | dense / sparse |",
        "|---|---:|---:|---:|",
    ]
    def per(key: str, path: str) -> float:
        return statistics.mean(r[path][key] for r in results)

    wire = {k: per("rx_per_step", k) + per("tx_per_step", k) for k in ("dense", "sparse")}
    pay = {k: per("payload_per_step", k) for k in ("dense", "sparse")}
    lines.append(f"| bytes on the wire (interface rx + tx) | {wire['dense'] / 1e6:,.2f} MB | "
                 f"{wire['sparse'] / 1e6:,.3f} MB | **{wire['dense'] / wire['sparse']:,.1f}x** |")
    lines.append(f"| payload bytes (engine / sparse client counters) | {pay['dense'] / 1e6:,.2f} MB | "
                 f"{pay['sparse'] / 1e6:,.3f} MB | {pay['dense'] / pay['sparse']:,.1f}x |")
    lines.append(f"| ideal payload (dense 2·R·D·4; sparse 2·u·(8 + 4·D)) | {ideal_dense / 1e6:,.2f} MB | "
                 f"{ideal_sparse / 1e6:,.3f} MB | {ideal_dense / ideal_sparse:,.1f}x |")
    steps = {k: sorted(t for r in results for t in r[k]["step_s"]) for k in ("dense", "sparse")}
    med = {k: statistics.median(v) for k, v in steps.items()}
    lines.append(f"| step time, median (min–max over both workers) | {med['dense']:.2f} s ({steps['dense'][0]:.2f}–"
                 f"{steps['dense'][-1]:.2f}) | {1000 * med['sparse']:.1f} ms ({1000 * steps['sparse'][0]:.1f}–"
                 f"{1000 * steps['sparse'][-1]:.1f}) | **{med['dense'] / med['sparse']:,.1f}x** |")
    if rate_Bps:
        duplex = {k: max(per("rx_per_step", k), per("tx_per_step", k)) / rate_Bps for k in ("dense", "sparse")}
        serial = {k: (per("rx_per_step", k) + per("tx_per_step", k)) / rate_Bps for k in ("dense", "sparse")}
        lines.append(f"| bound, both directions at once: busier direction's wire bytes / link rate | "
                     f"{duplex['dense']:.2f} s | {1000 * duplex['sparse']:.1f} ms | |")
        lines.append(f"| bound, one direction after the other: wire rx + tx / link rate | {serial['dense']:.2f} s | "
                     f"{1000 * serial['sparse']:.1f} ms | |")
        lines.append(f"| step time / its path's bound (dense: both at once; sparse: one after the other) | "
                     f"{med['dense'] / duplex['dense']:.2f} | {med['sparse'] / serial['sparse']:.2f} | |")
        lines += ["", "Why two bounds: dense push_pull pipelines its partitions, so its pushes (up) and the sums "
                  "(down) share the step. A sparse step cannot: the next lookup's rows are the ones this step's "
                  "push updates, so its pull is answered only after every worker's push reached the servers and "
                  "the round was applied; the push (up) and the pull (down) follow each other."]
    lines += ["", "Goals (issue 17): ≥ 20x fewer bytes per step than dense push_pull, and faster on the emulated "
              "cluster at 100 Mbit/s."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
