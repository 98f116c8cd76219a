"""DiLoCo against synchronous training on an emulated slow, far cluster: compute utilisation and bytes per token.

    flock /tmp/pushpull-cpu.lock python benchmarks/diloco_speed.py [--cells 100mbit:50ms,1gbit:10ms]
        [--batch 128] [--n-embd 384 --n-layer 6 --n-head 6 | --profile NAME_OR_FILE] [--h 100]
        [--fragments 4] [--overlap T] [--steps 200] [--sync-steps 10] [--out docs/results/diloco_speed.md]

One job per cell (link rate and one-way delay): 4 worker hosts and 2 server hosts of their own (separate
placement), every link shaped both ways. The model is the language model of ``benchmarks/diloco_quality.py``
(a GPT-2 from a ``transformers`` config, byte level, context 128; 10.8 M parameters at the defaults) as a
per-layer profile (``pushpull.bench.profile_cli.estimate_profile``: its operator graph costed on the
project's V100-class reference GPU at ``--batch`` windows per worker). Every worker replays that profile
(``pushpull.bench.emulated_model``: each layer's forward and backward as a sleep, its gradients ready layer by
layer as in a real backward pass, so synchronous strategies overlap communication with the backward as they
would on a GPU, whose compute costs this VM's 2 cores nothing), and runs, one after the other in the same job:

* **local**: the same steps without any communication, all workers at once: this VM's ceiling (what the
  emulation itself costs on top of the profile's compute: the inner optimizer's step, the gradients' memory);
* **sync**: ``DistributedOptimizer`` with ``PUSHPULL_STRATEGY=auto`` (pushpull.torch.executors.auto): it
  measures the candidates (PS and the gloo ring, each scheduling strategy) over its untimed warm-up steps
  and keeps the fastest, which is timed; the row says what it chose;
* **ddp**: PyTorch's ``DistributedDataParallel`` (gloo, 25 MB buckets) on the same 4 worker hosts: the peer
  most users would otherwise pick;
* **DiLoCo** (pushpull.torch.DiLoCo, H = ``--h``): inner steps alone, an outer round every H steps;
* **streaming DiLoCo**: the same with ``--fragments`` F fragments and int8 pseudo-gradients, each exchange
  overlapping ``--overlap`` inner steps: by default the planner's shortest overlap that hides the cell's
  exchange (``pushpull.sim.diloco.overlap_for``, at most a quarter of H).

Utilisation = compute time (the profile's, per step) / wall time. Bytes per step from each worker host's
interface counters (everything on the wire, TCP/IP headers included), per token at ``--batch`` x 128 tokens
per worker per step. Printed beside them: the bounds (PS: c + (n/k) M/B; ring: c + 2(n-1)/n M/B, both
without overlap, and the link's time alone) and the simulator's prediction for the same cluster (the
planner's model). Needs root (network namespaces). Speed only: quality is ``benchmarks/diloco_quality.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

WORKERS, SERVERS = 4, 2
CONTEXT = 128          # tokens per window, as benchmarks/diloco_quality.py
DDP_BUCKET_MB = 25.0   # DistributedDataParallel's default
LOG_DIR = Path("/tmp/pushpull-diloco-bench")


def lm_profile(args):
    """The per-layer profile every worker replays: ``--profile`` if given, else the quality benchmark's
    language model estimated at ``--batch`` windows per worker."""
    from pushpull.profiles import load_profile

    if args.profile:
        return load_profile(args.profile)
    from transformers.utils import logging as hf_logging

    from pushpull.bench.profile_cli import estimate_profile

    hf_logging.set_verbosity_error()
    return estimate_profile("gpt2", args.batch, vocab_size=256, n_positions=CONTEXT, n_embd=args.n_embd,
                            n_layer=args.n_layer, n_head=args.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def worker(args) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import pushpull.torch as bps
    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.bench.grid_child import link_bytes
    from pushpull.bench.grid_spec import AUTO_WARMUP
    from pushpull.profiles import load_profile
    from pushpull.torch import allreduce_backend
    from pushpull.torch.executors import make_strategy

    torch.set_num_threads(1)
    bps.init()
    iface = os.environ.get("DMLC_INTERFACE", "lo")
    prof = load_profile(args.profile_path)
    c = prof.compute_s
    x = torch.zeros(1)
    res: dict = {"rank": bps.rank(), "iface": iface}

    def measure(name: str, steps: int, one_step) -> None:
        bps.barrier()
        rx0, tx0 = link_bytes(iface)
        t0 = time.perf_counter()
        for _ in range(steps):
            one_step()
        wall = time.perf_counter() - t0
        bps.barrier()
        rx1, tx1 = link_bytes(iface)
        res[name] = {"steps": steps, "wall_s": wall, "compute_s": steps * c,
                     "rx_per_step": (rx1 - rx0) / steps, "tx_per_step": (tx1 - tx0) / steps}

    def stepper(model, opt, forward=None):
        forward = forward or model

        def step() -> None:
            opt.zero_grad()
            forward(x).sum().backward()
            opt.step()
        return step

    # local: the emulation's own cost, every worker at once, no communication
    model = EmulatedModel(prof)
    local = stepper(model, torch.optim.SGD(model.parameters(), lr=0.0))
    local()
    measure("local", args.sync_steps, local)

    # sync: the strategy auto chooses over its untimed warm-up (PS or the ring, and how to schedule)
    model = EmulatedModel(prof)
    strategy = make_strategy("auto")
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), strategy=strategy, model=model,
                                   named_parameters=[(f"sync.{n}", p) for n, p in model.named_parameters()])
    sync = stepper(model, opt)
    for _ in range(AUTO_WARMUP):
        sync()
    measure("sync", args.sync_steps, sync)
    res["sync"]["decision"] = {k: strategy.decision.get(k) for k in ("final", "kept", "reason")}
    opt.remove_hooks()

    # ddp: PyTorch's own, over gloo among the worker hosts (the group joined through pushpull's all-reduce backend)
    allreduce_backend.get_reducer()
    model = EmulatedModel(prof)
    ddp = DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_MB)
    ddp_step = stepper(model, torch.optim.SGD(model.parameters(), lr=0.0), ddp)
    for _ in range(2):
        ddp_step()
    measure("ddp", args.sync_steps, ddp_step)

    def diloco(name: str, **kw) -> None:
        model = EmulatedModel(prof)
        inner = torch.optim.SGD(model.parameters(), lr=0.01)
        opt = bps.DiLoCo(inner, list(model.named_parameters()), sync_every=args.h, name=name, **kw)
        step = stepper(model, opt)
        # the first H steps hold no round of the later fragments (fragment f's first is at H + f H / F):
        # warm up over them, then measure whole periods of H, each holding one round of every fragment
        for _ in range(args.h):
            step()
        measure(name, args.steps, step)
        opt.sync()

    diloco("diloco")
    diloco("streaming", fragments=args.fragments, overlap=args.overlap,
           compression=bps.Compression.build("int8", block=256))
    print("RESULT " + json.dumps(res), flush=True)
    allreduce_backend.shutdown()
    bps.shutdown()


def cluster_config(cell: dict, backend: str = "ps"):
    from pushpull.sim.config import ClusterConfig, parse_duration

    return ClusterConfig(workers=WORKERS, servers=SERVERS, bandwidth=cell["rate_Bps"], backend=backend,
                         latency=parse_duration(cell["delay"]) if cell["delay"] else 50e-6)


def streaming_overlap(args, prof, cell: dict) -> int:
    """``--overlap``, or the planner's shortest overlap that hides one fragment's exchange on this cell."""
    if args.overlap is not None:
        return args.overlap
    from pushpull.sim.diloco import DiLoCoSetting, overlap_for, predict

    probe = predict(prof, cluster_config(cell), DiLoCoSetting(args.h, args.fragments, 0, "int8"))
    return overlap_for(probe.exchange_s, probe.compute_s, args.h, args.fragments)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default="100mbit:50ms,1gbit:10ms", help="rate:one-way delay, comma-separated")
    p.add_argument("--batch", type=int, default=128, help="windows of 128 tokens per worker per step")
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--profile", default=None,
                   help="a profile name or file instead of the language model (its batch is then the profile's)")
    p.add_argument("--h", type=int, default=100, help="DiLoCo's H: inner steps per outer round")
    p.add_argument("--fragments", type=int, default=4)
    p.add_argument("--overlap", type=int, default=None,
                   help="streaming: inner steps an exchange overlaps (default: the planner's, per cell)")
    p.add_argument("--steps", type=int, default=200,
                   help="timed DiLoCo steps, after H untimed ones (a multiple of H: whole periods)")
    p.add_argument("--sync-steps", type=int, default=10, help="timed synchronous (and local) steps")
    p.add_argument("--congestion", default="cubic")
    p.add_argument("--no-slow-start-after-idle", action="store_true",
                   help="net.ipv4.tcp_slow_start_after_idle=0 on every emulated host (Linux's default is 1: an "
                        "idle connection starts again from the initial window)")
    p.add_argument("--out", default=None, help="write the results page here (markdown, and .json beside it)")
    p.add_argument("--save-profile", default=None,
                   help="only write the model's profile to this file (for `pushpull bench grid` configs) and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--profile-path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps % args.h:
        p.error(f"--steps ({args.steps}) must be a multiple of --h ({args.h}): whole periods of every fragment")
    if args.worker:
        worker(args)
        return 0

    from pushpull.emulate import EmulatedCluster
    from pushpull.emulate.jobs import launch_job
    from pushpull.units import rate_bytes

    prof = lm_profile(args)
    if args.save_profile:
        prof.save(args.save_profile)
        return 0
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    prof_path = LOG_DIR / "profile.json"
    prof.save(prof_path)
    cells = []
    for spec in args.cells.split(","):
        rate, _, delay = spec.partition(":")
        cell = {"rate": rate, "delay": delay, "rate_Bps": rate_bytes(rate)}
        overlap = streaming_overlap(args, prof, cell)
        argv_w = [sys.executable, str(Path(__file__).resolve()), "--worker", "--profile-path", str(prof_path),
                  "--h", str(args.h), "--fragments", str(args.fragments), "--overlap", str(overlap),
                  "--steps", str(args.steps), "--sync-steps", str(args.sync_steps)]
        t0 = time.monotonic()
        with EmulatedCluster(WORKERS + SERVERS, rate=rate, delay=delay or None, congestion=args.congestion) as cl:
            if args.no_slow_start_after_idle:
                import subprocess
                for h in range(WORKERS + SERVERS):
                    subprocess.run(["ip", "netns", "exec", cl.ns(h), "sysctl", "-qw",
                                    "net.ipv4.tcp_slow_start_after_idle=0"], check=True)
            job = launch_job(cl, WORKERS, SERVERS, argv_w, placement="separate", log_dir=str(LOG_DIR),
                             env={"OMP_NUM_THREADS": "1", "PUSHPULL_TIMEOUT": "300"})
            job.wait(3600)
            emulated = cl.emulated
            results = [job[f"worker{w}"].result() for w in range(WORKERS)]
        cells.append(dict(cell, rate_Bps=cell["rate_Bps"] if emulated else None, overlap=overlap,
                          workers=results, wall_s=time.monotonic() - t0))
    text = report(args, prof, cells)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"args": vars(args), "cells": cells}, indent=1))
    return 0


def predictions(args, prof, cell: dict) -> dict:
    """The simulator's utilisation and bytes ratio for each method on this cell's cluster (none unshaped):
    sync as the strategy auto kept, DiLoCo as the planner models it; DDP has no model in the simulator."""
    if not cell["rate_Bps"]:
        return {}
    from pushpull.sim.diloco import DiLoCoSetting, predict
    from pushpull.sim.events import simulate

    c = prof.compute_s
    out = {}
    final = cell["workers"][0]["sync"]["decision"].get("final")
    # a worker host's link per synchronous step: M each way to the servers, 2(n-1)/n M each way in a ring
    sync_factor = 1.0
    if final:
        it = simulate(prof, cluster_config(cell, final["backend"]), final["strategy"], trace=False).iteration_s
        out["sync"] = (c / it, 1.0)
        if final["backend"] == "allreduce":
            sync_factor = 2 * (WORKERS - 1) / WORKERS
    for name, st in (("diloco", DiLoCoSetting(args.h)),
                     ("streaming", DiLoCoSetting(args.h, args.fragments, cell["overlap"], "int8"))):
        r = predict(prof, cluster_config(cell), st)
        out[name] = (r.utilisation, r.fewer_bytes * sync_factor)
    return out


def _chosen(decision: dict) -> str:
    final = decision.get("final")
    if not final:
        return "auto (no final choice)"
    return f"auto: {final['backend']} {final['strategy']}"


def report(args, prof, cells: list[dict]) -> str:
    from pushpull.bench.grid_spec import AUTO_WARMUP

    m = sum(t.nbytes for t in prof.tensors())
    c = prof.compute_s
    n, k = WORKERS, SERVERS
    tokens = prof.batch_size * CONTEXT
    model = (f"`--profile {args.profile}`" if args.profile else
             f"the quality benchmark's GPT-2 ({args.n_embd} wide, {args.n_layer} layers, {args.n_head} heads)")
    cmd = ("`flock /tmp/pushpull-cpu.lock python benchmarks/diloco_speed.py --cells " + args.cells
           + (f" --profile {args.profile}" if args.profile else
              f" --batch {args.batch} --n-embd {args.n_embd} --n-layer {args.n_layer} --n-head {args.n_head}")
           + f" --h {args.h} --fragments {args.fragments}"
           + (f" --overlap {args.overlap}" if args.overlap is not None else "")
           + f" --steps {args.steps} --sync-steps {args.sync_steps}"
           + (" --no-slow-start-after-idle" if args.no_slow_start_after_idle else "") + "`")
    lines = ["# DiLoCo against synchronous training: utilisation and bytes per token", "",
             f"{cmd}: {n} worker hosts and {k} server hosts of their own. The model: {model}, "
             f"{sum(t.numel for t in prof.tensors()) / 1e6:.1f} M parameters ({m / 1e6:.1f} MB of fp32 in "
             f"{len(list(prof.tensors()))} tensors), its per-layer profile at {prof.batch_size} windows of "
             f"{CONTEXT} tokens per worker ({prof.device}, {prof.source}): c = {1e3 * c:.1f} ms of compute per "
             f"step, replayed by every worker layer by layer (sleeps; gradients ready in backward order). "
             f"{tokens:,} tokens per worker per step. sync: `DistributedOptimizer` with the strategy auto kept "
             f"after its {AUTO_WARMUP} untimed warm-up steps; DDP: PyTorch's, gloo, {DDP_BUCKET_MB:g} MB "
             f"buckets; DiLoCo H = {args.h}; streaming: {args.fragments} fragments, int8 pseudo-gradients "
             f"(256-element blocks), each exchange overlapping the planner's shortest overlap that hides it on "
             f"the cell (or `--overlap`). Means over the {n} workers; bytes from each worker host's interface "
             f"counters; local: the same steps with no communication, all workers at once (this VM's ceiling).",
             "", "Predicted: the simulator on the same cluster (sync: the strategy auto kept; DiLoCo: the planner's "
             "model, `pushpull.sim.diloco`). Bounds without overlap: PS c + (n/k) M/B, ring c + 2(n-1)/n M/B.", "",
             "| link | method | step (ms) | compute utilisation | predicted | wire bytes per step (rx + tx) "
             "| bytes per token | fewer bytes than sync | predicted fewer | bound (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for cell in cells:
        ws = cell["workers"]
        link = f"{cell['rate']}, {cell['delay'] or '0'} one way" + ("" if cell["rate_Bps"] else " (NOT SHAPED)")
        b = cell["rate_Bps"]

        def mean(name: str, key: str) -> float:
            return statistics.mean(w[name][key] for w in ws)
        sync_bytes = mean("sync", "rx_per_step") + mean("sync", "tx_per_step")
        pred = predictions(args, prof, cell)
        ps_bound = f"PS {1e3 * (c + max(1, n / k) * m / b):,.0f}" if b else ""
        ring_bound = f"ring {1e3 * (c + 2 * (n - 1) / n * m / b):,.0f}" if b else ""
        decision = ws[0]["sync"].get("decision") or {}
        chosen_ring = (decision.get("final") or {}).get("backend") == "allreduce"
        rows = (("local", "local: no communication (ceiling)", f"c {1e3 * c:.0f}"),
                ("sync", f"synchronous, {_chosen(decision)}", ring_bound if chosen_ring else ps_bound),
                ("ddp", "synchronous, PyTorch DDP", ring_bound),
                ("diloco", f"DiLoCo H = {args.h}", f"c {1e3 * c:.0f}"),
                ("streaming", f"streaming DiLoCo, F = {args.fragments}, overlap {cell['overlap']}, int8",
                 f"c {1e3 * c:.0f}"))
        for name, label, bound in rows:
            step = mean(name, "wall_s") / ws[0][name]["steps"]
            util = mean(name, "compute_s") / mean(name, "wall_s")
            wire = mean(name, "rx_per_step") + mean(name, "tx_per_step")
            pu, pf = pred.get(name, (None, None))
            fewer = "" if name == "local" else f"{sync_bytes / wire:,.1f}x"
            lines.append(f"| {link} | {label} | {1e3 * step:,.0f} | {util:.3f} | "
                         f"{'' if pu is None else f'{pu:.3f}'} | {wire / 1e6:,.3f} MB | "
                         f"{'' if name == 'local' else f'{wire / tokens:,.1f}'} | {fewer} | "
                         f"{'' if pf is None else f'{pf:,.1f}x'} | {bound} |")
    lines += ["", "auto's reasons: " + "; ".join(
        f"{cell['rate']}/{cell['delay']}: {(cell['workers'][0]['sync'].get('decision') or {}).get('reason')}"
        for cell in cells), "",
        "Goals (issue 29, item 5): streaming DiLoCo's compute utilisation >= 90 % where synchronous push_pull "
        "and DDP get what they get, and >= 100x fewer bytes per token than synchronous."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
