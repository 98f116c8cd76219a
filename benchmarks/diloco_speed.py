"""DiLoCo against synchronous push_pull on an emulated slow, far cluster: compute utilisation and bytes per token.

    flock /tmp/pushpull-cpu.lock python benchmarks/diloco_speed.py [--cells 100mbit:50ms,1gbit:10ms]
        [--mb 8] [--compute-ms 100] [--steps 100] [--sync-steps 10] [--out docs/results/diloco_speed.md]

One job per cell (link rate and one-way delay): 4 worker hosts and 2 server hosts of their own (separate
placement), every link shaped both ways. Each worker holds a model of ``--mb`` MB of fp32 parameters (a
small language model's size; 2.1 M parameters at 8 MB) and emulates the forward and backward pass of each
step by sleeping ``--compute-ms`` (a GPU's compute, which costs this VM's 2 cores nothing), then runs, one
after the other in the same job:

* **sync**: every step, push_pull of the whole gradient (the model's bytes up and their average down);
* **DiLoCo** (pushpull.torch.DiLoCo, H = ``--h``): inner steps alone, an outer round every H steps;
* **streaming DiLoCo**: the same with ``--fragments`` F fragments whose exchanges overlap ``--overlap`` inner
  steps, and int8 pseudo-gradients.

Utilisation = compute time / wall time (what a GPU would be busy for); bytes per step from the worker host's
interface counters (everything on the wire, TCP/IP headers included), per token at ``--tokens`` tokens per
worker per step. The sync step's bound c + M/B is printed beside it (full duplex: M up and M down at once).
Needs root (network namespaces). A diagnostic of speed only: quality is a separate benchmark (docs/diloco.md).
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
WORKERS, SERVERS = 4, 2


def model_sizes(mb: float) -> list[int]:
    """The emulated model: ``mb`` MB of fp32 parameters in eight tensors, as layers (the workers' and the
    simulator's prediction alike)."""
    numel = int(mb * 1e6 / 4)
    return [numel // 8] * 7 + [numel - 7 * (numel // 8)]


def worker(args) -> None:
    import torch

    import pushpull.torch as bps
    from pushpull.bench.grid_child import link_bytes

    torch.set_num_threads(1)
    bps.init()
    iface = os.environ.get("DMLC_INTERFACE", "lo")
    sizes = model_sizes(args.mb)
    c = args.compute_ms / 1e3
    res: dict = {"rank": bps.rank(), "iface": iface}

    def model():
        torch.manual_seed(0)
        return [torch.nn.Parameter(torch.randn(n) * 0.01) for n in sizes]

    def measure(name: str, steps: int, one_step) -> None:
        bps.barrier()
        rx0, tx0 = link_bytes(iface)
        t0 = time.perf_counter()
        for s in range(steps):
            one_step(s)
        wall = time.perf_counter() - t0
        bps.barrier()
        rx1, tx1 = link_bytes(iface)
        res[name] = {"steps": steps, "wall_s": wall, "compute_s": steps * c,
                     "rx_per_step": (rx1 - rx0) / steps, "tx_per_step": (tx1 - tx0) / steps}

    # sync: each step's whole gradient through the servers
    params = model()
    grads = [torch.randn(n) * 1e-3 for n in sizes]

    def sync_step(s: int) -> None:
        time.sleep(c)
        hs = [bps.push_pull_async_inplace(g, average=True, name=f"sync.{i}") for i, g in enumerate(grads)]
        for h in hs:
            bps.synchronize(h)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-0.1)

    sync_step(0)  # declarations and the first round, not timed
    measure("sync", args.sync_steps, sync_step)

    def diloco(name: str, **kw) -> None:
        ps = model()
        inner = torch.optim.SGD(ps, lr=0.1)
        opt = bps.DiLoCo(inner, [(f"p{i}", p) for i, p in enumerate(ps)], sync_every=args.h, name=name, **kw)
        gen = torch.Generator().manual_seed(bps.rank())
        fixed = [torch.randn(p.shape, generator=gen) * 1e-3 for p in ps]  # drawn once: the emulation costs no CPU

        def step(s: int) -> None:
            time.sleep(c)
            for p, g in zip(ps, fixed):
                p.grad = g
            opt.step()
        # the first H steps hold no round of the later fragments (fragment f's first is at H + f H / F):
        # warm up over them, then measure whole periods of H, each holding one round of every fragment
        for s in range(args.h):
            step(s)
        measure(name, args.steps, step)
        opt.sync()

    diloco("diloco")
    diloco("streaming", fragments=args.fragments, overlap=args.overlap,
           compression=bps.Compression.build("int8", block=256))
    print("RESULT " + json.dumps(res), flush=True)
    bps.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default="100mbit:50ms,1gbit:10ms", help="rate:one-way delay, comma-separated")
    p.add_argument("--mb", type=float, default=8.0, help="model size, MB of fp32 parameters")
    p.add_argument("--compute-ms", type=float, default=100.0, help="emulated forward + backward per step")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per worker per step (for bytes per token)")
    p.add_argument("--h", type=int, default=100, help="DiLoCo's H: inner steps per outer round")
    p.add_argument("--fragments", type=int, default=4)
    p.add_argument("--overlap", type=int, default=20, help="streaming: inner steps an exchange overlaps")
    p.add_argument("--steps", type=int, default=200,
                   help="timed DiLoCo steps, after H untimed ones (a multiple of H: whole periods)")
    p.add_argument("--sync-steps", type=int, default=10, help="timed synchronous steps")
    p.add_argument("--congestion", default="cubic")
    p.add_argument("--no-slow-start-after-idle", action="store_true",
                   help="net.ipv4.tcp_slow_start_after_idle=0 on every emulated host (Linux's default is 1: an "
                        "idle connection starts again from the initial window)")
    p.add_argument("--out", default=None, help="write the results page here (markdown, and .json beside it)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps % args.h:
        p.error(f"--steps ({args.steps}) must be a multiple of --h ({args.h}): whole periods of every fragment")
    if args.worker:
        worker(args)
        return 0

    from pushpull.emulate import EmulatedCluster
    from pushpull.emulate.jobs import launch_job
    from pushpull.units import rate_bytes

    cells = []
    for cell in args.cells.split(","):
        rate, _, delay = cell.partition(":")
        argv_w = [sys.executable, str(Path(__file__).resolve()), "--worker"] + [
            a for k, v in vars(args).items() if k not in ("worker", "out", "cells", "congestion", "no_slow_start_after_idle")
            for a in (f"--{k.replace('_', '-')}", str(v))]
        t0 = time.monotonic()
        with EmulatedCluster(WORKERS + SERVERS, rate=rate, delay=delay or None, congestion=args.congestion) as cl:
            if args.no_slow_start_after_idle:
                import subprocess
                for h in range(WORKERS + SERVERS):
                    subprocess.run(["ip", "netns", "exec", cl.ns(h), "sysctl", "-qw",
                                    "net.ipv4.tcp_slow_start_after_idle=0"], check=True)
            job = launch_job(cl, WORKERS, SERVERS, argv_w, placement="separate", log_dir="/tmp/pushpull-diloco-bench",
                             env={"OMP_NUM_THREADS": "1", "PUSHPULL_TIMEOUT": "300"})
            job.wait(1800)
            emulated = cl.emulated
            results = [job[f"worker{w}"].result() for w in range(WORKERS)]
        cells.append({"rate": rate, "delay": delay, "rate_Bps": rate_bytes(rate) if emulated else None,
                      "workers": results, "wall_s": time.monotonic() - t0})
    text = report(args, cells)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"args": vars(args), "cells": cells}, indent=1))
    return 0


def predictions(args, cell: dict) -> dict:
    """The simulator's utilisation and bytes ratio for each method on this cell's cluster (none unshaped)."""
    if not cell["rate_Bps"]:
        return {}
    from pushpull.sim.config import ClusterConfig, parse_duration
    from pushpull.sim.diloco import DiLoCoSetting, predict
    from pushpull.sim.events import simulate
    from pushpull.sim.synthetic import synthetic_profile

    sizes = model_sizes(args.mb)  # the worker's eight tensors
    c = args.compute_ms / 1e3
    prof = synthetic_profile([[n] for n in sizes], fwd_s=c / 3 / len(sizes))
    cluster = ClusterConfig(workers=WORKERS, servers=SERVERS, bandwidth=cell["rate_Bps"],
                            latency=parse_duration(cell["delay"]) if cell["delay"] else 50e-6)
    out = {"sync": (c / simulate(prof, cluster, "bsp", trace=False).iteration_s, 1.0)}
    for name, st in (("diloco", DiLoCoSetting(args.h)),
                     ("streaming", DiLoCoSetting(args.h, args.fragments, args.overlap, "int8"))):
        r = predict(prof, cluster, st)
        out[name] = (r.utilisation, r.fewer_bytes)
    return out


def report(args, cells: list[dict]) -> str:
    m = args.mb * 1e6
    c = args.compute_ms / 1e3
    cmd = (f"`flock /tmp/pushpull-cpu.lock python benchmarks/diloco_speed.py --cells {args.cells} --mb {args.mb:g} "
           f"--compute-ms {args.compute_ms:g} --h {args.h} --fragments {args.fragments} --overlap {args.overlap} "
           f"--steps {args.steps} --sync-steps {args.sync_steps}"
           + (" --no-slow-start-after-idle" if getattr(args, "no_slow_start_after_idle", False) else "") + "`")
    lines = ["# DiLoCo against synchronous push_pull: utilisation and bytes per token", "",
             f"{cmd}: {WORKERS} worker hosts, {SERVERS} server hosts of their own, a {args.mb:g} MB fp32 model, "
             f"{args.compute_ms:g} ms of emulated compute per step (a sleep: what a GPU would be busy for), "
             f"{args.tokens} tokens per worker per step; DiLoCo H = {args.h}; streaming: {args.fragments} fragments, "
             f"exchanges overlapping {args.overlap} inner steps, int8 pseudo-gradients (256-element blocks). "
             f"Means over the {WORKERS} workers; bytes from each worker host's interface counters.", "",
             "The simulator's prediction for the same cluster (pushpull.sim.diloco.predict; synchronous: bsp) "
             "is beside each measurement: the planner's model, validated here.", "",
             "| link | method | step (ms) | compute utilisation | predicted utilisation | wire bytes per step (rx + tx) "
             "| bytes per token | fewer bytes than sync | predicted fewer | bound |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for cell in cells:
        ws = cell["workers"]
        link = f"{cell['rate']}, {cell['delay'] or '0'} one way" + ("" if cell["rate_Bps"] else " (NOT SHAPED)")

        def mean(name: str, key: str) -> float:
            return statistics.mean(w[name][key] for w in ws)
        sync_bytes = mean("sync", "rx_per_step") + mean("sync", "tx_per_step")
        pred = predictions(args, cell)
        for name, label in (("sync", "synchronous push_pull"), ("diloco", f"DiLoCo H = {args.h}"),
                            ("streaming", f"streaming DiLoCo, F = {args.fragments}, int8")):
            step = mean(name, "wall_s") / ws[0][name]["steps"]
            util = mean(name, "compute_s") / mean(name, "wall_s")
            wire = mean(name, "rx_per_step") + mean(name, "tx_per_step")
            bound = ""
            if name == "sync" and cell["rate_Bps"]:
                # a PS step: c, then the servers' links carry n/k M each way (M when k >= n), full duplex
                bound = f"c + (n/k) M/B = {1e3 * (c + max(1, WORKERS / SERVERS) * m / cell['rate_Bps']):.0f} ms"
            elif name != "sync" and cell["rate_Bps"]:
                bound = f"c = {1e3 * c:.0f} ms (utilisation 1.0)"
            pu, pf = pred.get(name, (None, None))
            lines.append(f"| {link} | {label} | {1e3 * step:,.0f} | {util:.3f} | "
                         f"{'' if pu is None else f'{pu:.3f}'} | {wire / 1e6:,.3f} MB | "
                         f"{wire / args.tokens:,.1f} | {sync_bytes / wire:,.1f}x | "
                         f"{'' if pf is None else f'{pf:,.1f}x'} | {bound} |")
    lines += ["", "Goals (issue 29, item 5): streaming DiLoCo's compute utilisation >= 90 % where synchronous "
              "push_pull gets what it gets, and >= 100x fewer bytes per token than synchronous."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
