"""Reproduce published scheduling results with the simulator and write
docs/results/simulator.md plus its plots (docs/results/sim_*.png).

    python benchmarks/sim_reproduce.py            # ~1-2 min on one core
    python benchmarks/sim_reproduce.py --quick    # smaller grids, for a smoke run

Every number in the report comes from this script; the published figures
it is compared with are the published ones, each cited where it is used.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pushpull.profiles import Profile, load_profile
from pushpull.sim import ByteScheduler, ClusterConfig, Fusion, simulate
from pushpull.sim.events import _scaled
from pushpull.sim.plan import best_bytescheduler, comm_time

ROOT = Path(__file__).resolve().parents[1]
GBIT = 1e9 / 8

MODELS = {  # report name -> (profile, note)
    "VGG16": ("vgg16_v100", ""),
    "ResNet50": ("resnet50_v100", ""),
    "Transformer": ("bert_base_v100", "BERT-base profile standing in for ByteScheduler's Transformer"),
    "BERT-large": ("bert_large_v100", ""),
    "GPT-2": ("gpt2_v100", ""),
}


@dataclass
class Setup:
    machines: int
    gpus: int               # per machine
    gbit: float
    backend: str = "ps"
    latency: float = 50e-6
    servers: int | None = None
    colocated: bool = False

    def cluster(self, gbit: float | None = None) -> ClusterConfig:
        return ClusterConfig(workers=self.machines, servers=self.servers or self.machines,
                             bandwidth=(gbit or self.gbit) * GBIT, backend=self.backend, latency=self.latency,
                             local_size=self.gpus, colocated=self.colocated)

    def label(self) -> str:
        lay = (f"PS k={self.servers or self.machines}{' colocated' if self.colocated else ''}"
               if self.backend == "ps" else "ring all-reduce")
        return f"{self.machines}x{self.gpus} GPUs, {self.gbit:g} Gbit/s, {lay}"


_profiles: dict[str, Profile] = {}


def prof(model: str) -> Profile:
    name = MODELS[model][0]
    if name not in _profiles:
        _profiles[name] = load_profile(name)
    return _profiles[name]


def tuned(p: Profile, cl: ClusterConfig, quick: bool):
    kw = {}
    if quick:
        kw = dict(partitions_mb=(1, 4, 16, 64), credit_partitions=(2, 8, 32, math.inf))
    return best_bytescheduler(p, cl, **kw)


def strategies_row(model: str, setup: Setup, quick: bool, scale: float = 1.0) -> dict:
    p = _scaled(prof(model), scale)
    cl = setup.cluster()
    r = {s: simulate(p, cl, s, trace=False) for s in ("bsp", "wfbp", "fusion", "mgwfbp")}
    bs, bs_cfg = tuned(p, cl, quick)
    r["bytescheduler"] = bs
    return {"model": model, "setup": setup, "res": r, "bs_cfg": bs_cfg, "comm": comm_time(p, cl),
            "compute": p.compute_s}


def ms(x: float) -> str:
    return f"{x * 1e3:.0f}"


def fmt_cfg(s: ByteScheduler) -> str:
    c = "inf" if math.isinf(s.credit_bytes) else f"{s.credit_bytes / 1e6:g}"
    return f"{s.partition_bytes / 1e6:g} / {c}"


# ---------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------

def section_setup(out: list[str]) -> None:
    out.append("## Models\n")
    out.append("Profiles are the shipped `*_v100` ones (layer shapes with compute times scaled to a V100, "
               "batch 32 per GPU). Each machine's 8 GPUs reduce locally first (NVLink, taken as free), so "
               "the network sees one worker per machine; throughput counts every GPU.\n")
    out.append("| model | profile | params | tensors | gradient MB | fwd+bwd ms / iteration |")
    out.append("|---|---|---:|---:|---:|---:|")
    for m, (name, note) in MODELS.items():
        p = prof(m)
        out.append(f"| {m} | `{name}`{' (' + note + ')' if note else ''} | {p.numel / 1e6:.1f}M | "
                   f"{sum(1 for _ in p.tensors())} | {p.nbytes / 1e6:.0f} | {p.compute_s * 1e3:.0f} |")
    out.append("")


def section_scale(out: list[str], quick: bool) -> list[dict]:
    out.append("## Strategies at the papers' scale\n")
    out.append("Predicted iteration time (ms) per strategy; `bytescheduler` is the best point of the planner's "
               "grid (partition 1-64 MB x credit 1-32 partitions or unlimited), shown as partition / credit "
               "in MB. Speedups are ByteScheduler's over WFBP and over BSP. Latency 50 us at 10 Gbit/s "
               "(TCP), 10 us at 100 Gbit/s (RDMA).\n")
    out.append("| model | cluster | comm/compute | bsp | wfbp | fusion | mgwfbp | bytescheduler | "
               "partition / credit | vs wfbp | vs bsp |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    rows = []
    models = ["VGG16", "ResNet50", "Transformer"] if quick else list(MODELS)
    for model in models:
        for machines in (2, 8):
            for gbit in (10, 100):
                for backend in ("ps", "allreduce"):
                    s = Setup(machines, 8, gbit, backend, latency=50e-6 if gbit <= 25 else 10e-6)
                    row = strategies_row(model, s, quick)
                    rows.append(row)
                    r = row["res"]
                    bs = r["bytescheduler"].iteration_s
                    out.append(f"| {model} | {s.label()} | {row['comm'] / row['compute']:.2f} | "
                               + " | ".join(ms(r[k].iteration_s) for k in ("bsp", "wfbp", "fusion", "mgwfbp"))
                               + f" | {ms(bs)} | {fmt_cfg(row['bs_cfg'])} | "
                               f"{r['wfbp'].iteration_s / bs:.2f}x | {r['bsp'].iteration_s / bs:.2f}x |")
    out.append("")
    return rows


def bandwidth_sweep(quick: bool) -> dict:
    gbits = (1, 2.5, 5, 10, 25, 50, 100) if not quick else (1, 10, 100)
    curves = {}
    for model in ("VGG16", "Transformer", "ResNet50"):
        p = prof(model)
        pts = []
        for g in gbits:
            cl = Setup(2, 8, g, "ps", latency=50e-6 if g <= 25 else 10e-6).cluster()
            w = simulate(p, cl, "wfbp", trace=False)
            b = simulate(p, cl, "bsp", trace=False)
            bs, _ = tuned(p, cl, quick)
            pts.append((g, w.iteration_s / bs.iteration_s, b.iteration_s / bs.iteration_s,
                        comm_time(p, cl) / p.compute_s))
        curves[model] = pts
    return curves


def ratio_sweep(quick: bool) -> dict:
    ratios = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16) if not quick else (1 / 4, 1, 4)
    curves = {}
    setup = Setup(8, 8, 10, "ps")
    cl = setup.cluster()
    for model in ("VGG16", "ResNet50", "Transformer"):
        base = prof(model)
        comm = comm_time(base, cl)
        pts = []
        for r in ratios:
            p = _scaled(base, r * comm / base.compute_s)
            w = simulate(p, cl, "wfbp", trace=False)
            b = simulate(p, cl, "bsp", trace=False)
            bs, _ = tuned(p, cl, True)
            pts.append((r, w.iteration_s / bs.iteration_s, b.iteration_s / bs.iteration_s))
        curves[model] = pts
    return curves


def published_rows(quick: bool, scale_rows: list[dict], ratio: dict) -> list[tuple]:
    """(figure, source, published, simulated, setup, verdict)."""
    rows = []

    def bs_gain(model, setup, scale=1.0):
        row = strategies_row(model, setup, quick, scale)
        r = row["res"]
        return r["wfbp"].iteration_s / r["bytescheduler"].iteration_s, row

    # ByteScheduler README: 16 GPUs (2 machines x 8 V100), 100 Gbit/s RDMA, MXNet PS
    rdma = Setup(2, 8, 100, "ps", latency=10e-6)
    g, row = bs_gain("VGG16", rdma)
    rows.append(("ByteScheduler README: VGG16, 16 GPUs, 100G RDMA, PS", "~2x", f"{g:.2f}x",
                 f"{rdma.label()}; comm/compute {row['comm'] / row['compute']:.2f}",
                 "disagrees: far smaller" if g < 1.5 else "agrees in direction and size"))
    g, row = bs_gain("Transformer", rdma)
    rows.append(("ByteScheduler README: Transformer, 16 GPUs, 100G RDMA, PS", "2.7x", f"{g:.2f}x",
                 f"{rdma.label()}; comm/compute {row['comm'] / row['compute']:.2f}",
                 "disagrees: far smaller" if g < 1.8 else "agrees in direction and size"))
    # the largest gain the simulator finds anywhere in this report
    best = max(((row["res"]["wfbp"].iteration_s / row["res"]["bytescheduler"].iteration_s, row)
                for row in scale_rows), key=lambda x: x[0])
    best_ratio = max((g, m, r) for m, pts in ratio.items() for r, g, _ in pts)
    rows.append(("ByteScheduler paper: up to 2.96x (196 %)", "2.96x",
                 f"{max(best[0], best_ratio[0]):.2f}x",
                 f"best over the scale table ({best[1]['model']}, {best[1]['setup'].label()}: {best[0]:.2f}x) "
                 f"and the ratio sweep ({best_ratio[1]} at compute/comm {best_ratio[2]:g}: {best_ratio[0]:.2f}x)",
                 "disagrees: the simulator never reaches it over WFBP"))
    # How useful is communication scheduling: <= 3x, concave in the ratio
    max_vs_bsp = max((gb, m, r) for m, pts in ratio.items() for r, _, gb in pts)
    rows.append(("How Useful is Communication Scheduling: gain <= 3x", "<= 3x",
                 f"{max_vs_bsp[0]:.2f}x over BSP, {best_ratio[0]:.2f}x over WFBP",
                 f"ratio sweep, 8x8 GPUs, 10 Gbit/s PS (max over BSP: {max_vs_bsp[1]} at {max_vs_bsp[2]:g})",
                 "agrees (bound respected)"))
    # ddl-benchmarks, 32 GPUs (8 machines x 4 GPUs assumed), 100G; TCP effective ~25G assumed for "100G TCP"
    ddl_rdma = Setup(8, 4, 100, "allreduce", latency=10e-6)
    w = simulate(prof("ResNet50"), ddl_rdma.cluster(), "wfbp", trace=False)
    b = simulate(prof("ResNet50"), ddl_rdma.cluster(), ByteScheduler(), trace=False)  # default 32 MB / 64 MB
    rows.append(("ddl-benchmarks: ByteScheduler over all-reduce ~35 % slower than WFBP (ResNet-50)",
                 "0.74x", f"{w.iteration_s / b.iteration_s:.2f}x",
                 f"{ddl_rdma.label()}, ByteScheduler defaults (32 MB partitions, 64 MB credit)",
                 "disagrees: the simulator has them tie (it charges no per-partition framework overhead)"
                 if w.iteration_s / b.iteration_s > 0.9 else "agrees in direction"))
    ddl_tcp = Setup(8, 4, 25, "ps", latency=50e-6)
    g, row = bs_gain("BERT-large", ddl_tcp)
    rows.append(("ddl-benchmarks: ByteScheduler over PS vs WFBP, BERT-large, 100G TCP", "2.9x", f"{g:.2f}x",
                 f"{ddl_tcp.label()} (100G TCP taken as ~25 Gbit/s achieved)",
                 "disagrees: far smaller" if g < 1.8 else "agrees"))
    gs = []
    for m in ("ResNet50", "VGG16"):
        gg, _ = bs_gain(m, Setup(8, 4, 100, "ps", latency=10e-6))
        gs.append(f"{m} {gg:.2f}x")
    rows.append(("ddl-benchmarks: ByteScheduler over PS ties WFBP (other models)", "~1.0x", ", ".join(gs),
                 "8x4 GPUs, 100 Gbit/s PS", "agrees"))
    # ddl-benchmarks: MG-WFBP the best all-reduce method on fast networks
    ar = Setup(8, 4, 100, "allreduce", latency=10e-6)
    res = {s: simulate(prof("ResNet50"), ar.cluster(), s, trace=False).iteration_s
           for s in ("wfbp", "fusion", "mgwfbp", "bsp")}
    res["bytescheduler"] = b.iteration_s
    order = sorted(res, key=res.get)
    rows.append(("ddl-benchmarks: MG-WFBP best all-reduce method on fast networks (ResNet-50)", "mgwfbp first",
                 " < ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(res.items(), key=lambda kv: kv[1])),
                 f"{ar.label()}, ms per iteration",
                 ("tie: at 100 Gbit/s every overlapping strategy hides the communication"
                  if res[order[3]] <= res[order[0]] * 1.01 else
                  "agrees" if res["mgwfbp"] <= res[order[0]] * 1.005 else f"disagrees: {order[0]} is fastest")))
    # BytePS headline: +44 % ResNet50, +100 % VGG16 over Horovod (all-reduce) at 20 Gbit/s TCP
    for m, pub in (("ResNet50", "1.44x"), ("VGG16", "2.0x")):
        ps = Setup(8, 8, 20, "ps", latency=50e-6).cluster()
        hv = Setup(8, 8, 20, "allreduce", latency=50e-6).cluster()
        t_ps = simulate(prof(m), ps, "wfbp", trace=False).iteration_s
        t_hv = simulate(prof(m), hv, Fusion(), trace=False).iteration_s
        g = t_hv / t_ps
        rows.append((f"BytePS: {m} over Horovod, 20 Gbit/s TCP", pub, f"{g:.2f}x",
                     "8x8 GPUs; BytePS = PS with k=8 CPU servers, WFBP order; Horovod = ring + 64 MiB fusion",
                     "agrees in direction" + ("" if abs(g - float(pub[:-1])) / float(pub[:-1]) < 0.25
                                              else ", smaller" if g < float(pub[:-1]) else ", larger")))
    return rows


# ---------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------

def plot_ratio(curves: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for model, pts in curves.items():
        xs = [r for r, *_ in pts]
        axes[0].plot(xs, [g for _, g, _ in pts], marker="o", label=model)
        axes[1].plot(xs, [g for _, _, g in pts], marker="o", label=model)
    xs = sorted({r for pts in curves.values() for r, *_ in pts})
    axes[1].plot(xs, [(1 + r) / max(r, 0.5) for r in xs], "k--", lw=1,
                 label="bound (1+r)/max(r, 1/2): compute, push, pull serial")
    for ax, t in zip(axes, ("ByteScheduler (tuned) over WFBP", "ByteScheduler (tuned) over BSP")):
        ax.axhline(3, color="r", lw=1, ls=":", label="3x bound (How Useful...)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("computation / communication")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle("Simulated gain vs computation-to-communication ratio (8x8 GPUs, 10 Gbit/s, PS k=8)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bandwidth(curves: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (model, pts) in enumerate(curves.items()):
        c = f"C{i}"
        ax.plot([g for g, *_ in pts], [s for _, s, _, _ in pts], marker="o", color=c, label=f"{model} vs WFBP")
        ax.plot([g for g, *_ in pts], [s for _, _, s, _ in pts], marker=".", ls="--", color=c,
                label=f"{model} vs BSP")
    ax.axhline(2.0, color="grey", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth (Gbit/s)")
    ax.set_ylabel("ByteScheduler speedup")
    ax.set_title("16 GPUs (2x8), PS k=2: speedup vs bandwidth")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_published(rows: list[tuple], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = []
    for fig_, pub, sim, *_ in rows:
        try:
            p = float(pub.strip("~<= x"))
            s = float(sim.split("x")[0])
        except ValueError:
            continue
        src, what = fig_.split(":", 1)
        pts.append((f"{src}:\n{what.strip()[:40]}", p, s))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(pts))
    ax.bar([x - 0.2 for x in xs], [p for _, p, _ in pts], width=0.4, label="published")
    ax.bar([x + 0.2 for x in xs], [s for _, _, s in pts], width=0.4, label="simulated")
    ax.set_xticks(list(xs), [n for n, _, _ in pts], fontsize=6, rotation=25, ha="right")
    ax.set_ylabel("speedup")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    ap.add_argument("--quick", action="store_true", help="smaller grids and sweeps")
    a = ap.parse_args(argv)
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    body: list[str] = []
    section_setup(body)
    scale_rows = section_scale(body, a.quick)
    ratio = ratio_sweep(a.quick)
    bw = bandwidth_sweep(a.quick)
    pub = published_rows(a.quick, scale_rows, ratio)
    plot_ratio(ratio, outdir / "sim_ratio.png")
    plot_bandwidth(bw, outdir / "sim_bandwidth.png")
    plot_published(pub, outdir / "sim_published.png")

    md: list[str] = []
    md.append("# Simulator results\n")
    md.append(f"Generated by `benchmarks/sim_reproduce.py`{' --quick' if a.quick else ''} "
              f"({time.time() - t0:.0f} s); do not edit by hand. How the model works: "
              "[docs/simulator.md](../simulator.md).\n")
    md.append("## Published figures next to the simulation\n")
    md.append("![published vs simulated](sim_published.png)\n")
    md.append("| published figure | published | simulated | simulated setup | verdict |")
    md.append("|---|---|---|---|---|")
    for f, p, s, setup, v in pub:
        md.append(f"| {f} | {p} | {s} | {setup} | {v} |")
    md.append("")
    md.append(discussion(pub, ratio, bw, scale_rows))
    md.append("## Gain vs computation-to-communication ratio\n")
    md.append("Compute is rescaled so that compute / communication takes each value, where communication is "
              "one fused reduction of all gradients with nothing to overlap (BSP with zero compute). "
              "8 machines x 8 GPUs, 10 Gbit/s, PS with 8 servers.\n")
    md.append("![gain vs ratio](sim_ratio.png)\n")
    ratios = [r for r, *_ in next(iter(ratio.values()))]
    md.append("| model | " + " | ".join(f"{r:g}" for r in ratios) + " |")
    md.append("|---|" + "---:|" * len(ratios))
    for m, pts in ratio.items():
        md.append(f"| {m} vs WFBP | " + " | ".join(f"{g:.2f}" for _, g, _ in pts) + " |")
        md.append(f"| {m} vs BSP | " + " | ".join(f"{g:.2f}" for _, _, g in pts) + " |")
    md.append("")
    md.append(shape_note(ratio))
    md.append("")
    md.append("## Speedup vs bandwidth\n")
    md.append("![speedup vs bandwidth](sim_bandwidth.png)\n")
    gb = [g for g, *_ in next(iter(bw.values()))]
    md.append("| model | " + " | ".join(f"{g:g} Gbit/s" for g in gb) + " |")
    md.append("|---|" + "---:|" * len(gb))
    for m, pts in bw.items():
        md.append(f"| {m} vs WFBP | " + " | ".join(f"{s:.2f}" for _, s, _, _ in pts) + " |")
        md.append(f"| {m} vs BSP | " + " | ".join(f"{s:.2f}" for _, _, s, _ in pts) + " |")
        md.append(f"| {m} comm/compute | " + " | ".join(f"{c:.2f}" for *_, c in pts) + " |")
    md.append("")
    md.extend(body)
    page = outdir / "simulator.md"
    md.append(_existing_validation(page) or VALIDATION)
    page.write_text("\n".join(md).rstrip("\n") + "\n")   # the kept section ends in a newline already
    print(f"wrote {outdir / 'simulator.md'} and 3 plots in {time.time() - t0:.0f} s")
    return 0


def shape_note(ratio: dict) -> str:
    lines = []
    for m, pts in ratio.items():
        gw = [g for _, g, _ in pts]
        gb = [g for _, _, g in pts]
        i = max(range(len(gb)), key=gb.__getitem__)
        j = max(range(len(gw)), key=gw.__getitem__)
        lines.append(f"* {m}: over BSP the gain peaks at {gb[i]:.2f}x at compute/comm = {pts[i][0]:g} and falls "
                     f"on both sides; over WFBP it peaks at {gw[j]:.2f}x at {pts[j][0]:g}.")
    return "\n".join(lines)


def discussion(pub, ratio, bw, scale_rows) -> str:
    """The prose around the tables, with the numbers pulled from them."""
    def row(model, machines, gbit, backend="ps"):
        for r in scale_rows:
            st = r["setup"]
            if r["model"] == model and st.machines == machines and st.gbit == gbit and st.backend == backend:
                res = r["res"]
                return (res["wfbp"].iteration_s / res["bytescheduler"].iteration_s,
                        res["bsp"].iteration_s / res["bytescheduler"].iteration_s, r["comm"] / r["compute"])
        return None
    vgg10 = row("VGG16", 2, 10)
    tr10 = row("Transformer", 2, 10)
    peak_w = max((g, m, r) for m, pts in ratio.items() for r, g, _ in pts)
    peak_b = max((g, m, r) for m, pts in ratio.items() for r, _, g in pts)
    bw_peak = {m: max(pts, key=lambda p: p[1]) for m, pts in bw.items()}
    fb = {m: prof(m).fwd_s / prof(m).compute_s for m in ratio}
    out = ["### Where the simulation agrees and where it does not\n"]
    out.append(
        "* **Direction: agrees.** Priority scheduling with partitions and a credit helps when the job is "
        "communication-bound and does nothing when it is compute-bound; PS with as many CPU servers as workers "
        "beats ring all-reduce when the network is the bottleneck (the argument of BytePS (Jiang et al., OSDI 2020)).")
    out.append(
        "* **Size of ByteScheduler's published gains over the baseline: disagrees.** At 100 Gbit/s line rate "
        "and V100-class compute the simulator predicts no gain for VGG16 or the Transformer at 16 GPUs "
        "(README: ~2x and 2.7x): 100 Gbit/s moves VGG16's 553 MB in ~45 ms against ~350 ms of compute, so "
        "WFBP already hides it behind the backward pass. The simulator's gains appear only near an effective "
        "bandwidth of a few Gbit/s (peak over WFBP in the bandwidth sweep: "
        + ", ".join(f"{m} {p[1]:.2f}x at {p[0]:g} Gbit/s" for m, p in bw_peak.items())
        + "), which suggests the published baselines achieved far less than line rate.")
    if vgg10 and tr10:
        out.append(
            f"* **Against a no-overlap baseline, closer.** At 2x8 GPUs and 10 Gbit/s the tuned "
            f"ByteScheduler beats BSP by {vgg10[1]:.2f}x on VGG16 (published ~2x) and {tr10[1]:.2f}x on the "
            f"Transformer stand-in (published 2.7x, still well short), but WFBP by only {vgg10[0]:.2f}x and "
            f"{tr10[0]:.2f}x. In a "
            "model where WFBP overlaps the whole backward pass, what scheduling adds is overlap with the next "
            "forward pass, so the gain over WFBP is roughly 1 + F/(F+B) at best (F, B: forward and backward "
            "time; PS pipelining effects add a little); with B ~ 2F that is ~1.3-1.4x ("
            + ", ".join(f"{m}: F/(F+B) = {v:.2f}" for m, v in fb.items())
            + "). Published gains above that must come from effects the simulator leaves out (baseline "
            "engine and server overheads, stragglers, head-of-line blocking inside the framework).")
    # the scale table's cells count too (the published rows take the larger of the two)
    scale_w = max(((row["res"]["wfbp"].iteration_s / row["res"]["bytescheduler"].iteration_s, row)
                   for row in scale_rows), key=lambda x: x[0], default=(0.0, None))
    where_w = (f"{peak_w[0]:.2f}x ({peak_w[1]}, compute/comm = {peak_w[2]:g})" if scale_w[0] <= peak_w[0] else
               f"{scale_w[0]:.2f}x ({scale_w[1]['model']}, {scale_w[1]['setup'].label()}; in the ratio sweep "
               f"{peak_w[0]:.2f}x, {peak_w[1]} at compute/comm = {peak_w[2]:g})")
    out.append(
        f"* **\"Up to 2.96x\": not reproduced.** The largest gain over WFBP anywhere in this report is "
        f"{where_w}; over BSP in the ratio sweep {peak_b[0]:.2f}x ({peak_b[1]}, compute/comm = {peak_b[2]:g}).")
    late = [g for pts in ratio.values() for r, g, _ in pts if r >= 2]
    shapes = []
    for m, pts in ratio.items():
        gb = [g for _, _, g in pts]
        i = max(range(len(gb)), key=gb.__getitem__)
        rising = pts[: i + 1]
        slopes = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in zip(rising, rising[1:])]
        concave = all(s2 <= s1 * 1.05 for s1, s2 in zip(slopes, slopes[1:]))
        shapes.append(f"{m} {'concave' if concave else 'not concave'} (slopes "
                      + ", ".join(f"{x:.2f}" for x in slopes) + ")")
    over = [f"{m} {max(g for _, g, _ in pts):.2f}x vs 1 + F/(F+B) = {1 + fb[m]:.2f}" for m, pts in ratio.items()]
    out.append(
        "* **\"How useful is communication scheduling\": consistent on the bound, partly on the shape.** The "
        "simulated gain never exceeds 3x. Over BSP it stays under the bound (1+r)/max(r, 1/2) that treats "
        "compute, push and pull as three resources used one after the other (r = compute/comm; this is our "
        "reading of where the paper's 3x comes from: it is reached at r = 1/2) and peaks at r = "
        + ", ".join(f"{m} {max(pts, key=lambda p: p[2])[0]:g}" for m, pts in ratio.items()) + ". Over WFBP the extra gain is small "
        f"(largest {peak_w[0]:.2f}x; at most {max(late, default=1) :.2f}x once compute is at least twice the "
        "communication), matching the paper's conclusion that scheduling adds little on top of overlap; "
        "per model, the peak over WFBP against the 1 + F/(F+B) estimate above: ("
        + "; ".join(over) + "). The curve over BSP is single-peaked: it rises with r while communication "
        "dominates and falls like 1 + 1/r (convex) once compute dominates, so it is not concave over the whole "
        "axis; on the rising side (linear r, slopes between sweep points): " + "; ".join(shapes) + ".")
    out.append(
        "* **ddl-benchmarks: mostly not reproduced.** ByteScheduler over all-reduce being ~35 % slower than "
        "WFBP comes from per-partition framework overheads the simulator does not charge (it charges 2(n-1) "
        "latencies per collective), so it shows a tie; BERT-large's 2.9x over PS at 100G TCP is not "
        "reproduced either; the ties over PS for the other models are.")
    out.append(
        "* **BytePS vs Horovod** (PS with CPU servers vs ring all-reduce): same direction, smaller size; the PS "
        "advantage in bytes is at most 2(n-1)/n = 1.75x at n = 8 machines, and it only shows in time when the "
        "job is communication-bound.")
    out.append(
        "* **Tuned settings.** The planner's grid almost always picks the smallest partition (1 MB) for PS: "
        "the fluid model charges a message only its latency, so finer pipelining is free. Real systems pay "
        "per-message CPU costs, which is why ByteScheduler's own tuner searches from 8 MB up.\n")
    return "\n".join(out)


def _existing_validation(page: Path) -> str | None:
    """The validation section written by benchmarks/validate_sim.py, kept across reruns."""
    if not page.exists():
        return None
    text = page.read_text()
    i = text.find("## Validation against the emulated cluster")
    return "\n" + text[i:].rstrip("\n") + "\n" if i >= 0 else None


VALIDATION = """
## Validation against the emulated cluster

This section is filled by the benchmark runner, not by this script: the emulated-cluster benchmarks
(`pushpull bench`, real sockets, emulated compute) measure step times, and
`pushpull.sim.validate(measured_rows)` turns them into predicted-vs-measured per cell with the median absolute
error and the worst cell (`ValidationTable.to_markdown()` renders the table). Each measured row is a dict with
`model`, `strategy`, `backend`, `workers`, `servers`, `bandwidth`, `compute_scale` and `measured_step_s`.
Until those measurements exist, the numbers above are predictions only.
"""


if __name__ == "__main__":
    sys.exit(main())
