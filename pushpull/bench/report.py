"""``pushpull bench report RESULTS.jsonl``: tables and plots from a grid's results.

Writes into ``--out-dir`` (default: the results file's folder):

* ``<name>.md``: the generated part sits between ``<!-- report:begin -->`` and
  ``<!-- report:end -->``; text outside the markers (analysis written by hand)
  is kept when the report is regenerated. Tables: per group (model, backend,
  workers, servers, placement, bandwidth, ratio, PS key size) every strategy's median step
  time, throughput mean +- std over the tries (samples/s, all workers) and
  speedup over ``wfbp`` of the same group (over the group's
  first strategy where it has no ``wfbp``, e.g. ``wfbp+lw``); where both backends ran the same
  cell, PS's speedup over all-reduce; where ``auto`` ran, its step against the cell's best fixed
  choice over both backends.
* ``<name>_speedup.png``: speedup over wfbp per group (bars);
  ``<name>_bandwidth.png`` / ``<name>_ratio.png``: speedup against link
  bandwidth / computation-to-communication ratio, when the grid has more than
  one of those.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from pushpull.bench.grid_spec import KEY_DEFAULTS
from pushpull.cli import help_text

BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
GROUP = ("model", "backend", "workers", "servers", "placement", "bandwidth", "ratio", "local_size", "local_reduce",
         "ps_partition_bytes", "auth")


def _mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _gkey(r, drop=()):
    """A row's group; a field missing from rows written before it existed reads as what those rows ran
    with (the grid's KEY_DEFAULTS), so a re-run of one backend's cells pairs with the other's older rows."""
    return tuple(r.get(k, KEY_DEFAULTS.get(k)) for k in GROUP if k not in drop)


def aggregate(rows: list[dict]) -> list[dict]:
    """One entry per (group, strategy), repeats merged; speedup over wfbp of the same group."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault(_gkey(r) + (r["strategy"],), []).append(r)
    out = []
    for key, rs in cells.items():
        tries = [t for r in rs for t in r.get("try_throughput", [r["throughput"]])]
        m, s = _mean_std(tries)
        out.append({**dict(zip(GROUP, _gkey(rs[0]))), "strategy": rs[0]["strategy"],
                    "step_s": statistics.median(r["step_s"] for r in rs), "thr_mean": m, "thr_std": s,
                    "n_tries": len(tries), "mode": ",".join(sorted({r.get("mode", "?") for r in rs})),
                    "compute_scale": rs[0].get("compute_scale"), "size_scale": rs[0].get("size_scale"),
                    "grad_bytes": rs[0].get("grad_bytes"), "t_comm_s": statistics.median(r["t_comm_s"] for r in rs),
                    "compute_s": rs[0].get("compute_s"), "bandwidth_bytes_s": rs[0].get("bandwidth_bytes_s"),
                    "order": min(rows.index(r) for r in rs),
                    "local_active": any(r.get("local_reduce_active") for r in rs),
                    "link_bytes": _link_means(rs)})
    base, base_name = {}, {}
    for a in out:  # the baseline: wfbp, else the group's first strategy (e.g. wfbp+lw)
        if a["strategy"] == "wfbp" or _gkey(a) not in base:
            if a["strategy"] == "wfbp" or not any(b["strategy"] == "wfbp" and _gkey(b) == _gkey(a) for b in out):
                if a["strategy"] == "wfbp" or _gkey(a) not in base:
                    base[_gkey(a)], base_name[_gkey(a)] = a["step_s"], a["strategy"]
    for a in out:
        b = base.get(_gkey(a))
        a["speedup"] = b / a["step_s"] if b else None
        a["baseline"] = base_name.get(_gkey(a))
    out.sort(key=lambda a: a["order"])
    return out


def _link_means(rs: list[dict]) -> list[dict] | None:
    """Per worker host, the mean received and sent bytes per step over the rows (measured by the grid from
    the host's interface counters), or None where the rows have none."""
    per = [r.get("link_bytes") for r in rs if r.get("link_bytes")]
    if not per or any(h is None for p in per for h in p):
        return None
    return [{d: statistics.mean(p[i][d] for p in per) for d in ("rx", "tx")} for i in range(len(per[0]))]


def local_reduce_comparison(agg: list[dict]) -> list[dict]:
    """Cells with several processes per host: the local reduce (on) against each process pushing everything
    (off), with the bound c + M/B of one reduction per host (bounds(); a host's processes are one
    endpoint) and the flat path's, c + local_size x M/B."""
    flat = {_gkey(a, drop=("local_reduce",)) + (a["strategy"],): a for a in agg
            if (a.get("local_size") or 1) > 1 and a.get("local_reduce") == "off"}
    res = []
    for a in agg:
        if (a.get("local_size") or 1) > 1 and a.get("local_reduce") != "off":
            f = flat.get(_gkey(a, drop=("local_reduce",)) + (a["strategy"],))
            if f is None:
                continue
            b = bounds(a)["ps_bound_s"]
            c = a.get("compute_s")
            res.append({**a, "flat_step_s": f["step_s"], "speedup_over_flat": f["step_s"] / a["step_s"],
                        "bound_s": b, "flat_bound_s": c + a["local_size"] * (b - c) if b and c is not None else None,
                        "flat_link_bytes": f["link_bytes"], "flat_local_active": f["local_active"]})
    return res


def backend_comparison(agg: list[dict]) -> list[dict]:
    """PS cells next to the all-reduce cell of the same model, strategy, workers, bandwidth and ratio
    (an all-reduce has no servers, so its placement does not matter)."""
    # the PS key size and PUSHPULL_AUTH are no all-reduce settings (gloo is never encrypted)
    drop = ("backend", "servers", "placement", "ps_partition_bytes", "auth")
    # an all-reduce row carries the key size of the grid job it ran beside: a PS cell pairs with the ring that
    # ran in the same grid run where there is one (a re-run at another key size), else with any
    same_run = ("backend", "servers", "placement", "auth")
    ar, ar_same = {}, {}
    for a in agg:
        if a["backend"] == "allreduce":
            ar.setdefault(_gkey(a, drop=drop) + (a["strategy"],), a)
            ar_same.setdefault(_gkey(a, drop=same_run) + (a["strategy"],), a)
    res = []
    for a in agg:
        if a["backend"] == "ps":
            b = ar_same.get(_gkey(a, drop=same_run) + (a["strategy"],)) or ar.get(_gkey(a, drop=drop) + (a["strategy"],))
            if b:
                ddp = (ar_same.get(_gkey(a, drop=same_run) + ("ddp",)) or ar.get(_gkey(a, drop=drop) + ("ddp",)))
                res.append({**a, "ar_step_s": b["step_s"], "ps_over_ar": b["step_s"] / a["step_s"],
                            "ddp_step_s": ddp["step_s"] if ddp else None, **bounds(a)})
    return res


def bounds(a: dict) -> dict:
    """Each method's physical bound for the cell, c + bytes per link / B (c = compute, M = gradient bytes,
    B = link rate, n workers, k servers): PS with servers on hosts of their own c + max(1, n/k) M/B (a
    server's link carries n/k of M); PS colocated with k = n and the ring c + 2(n-1)/n M/B. Empty where a
    row lacks the numbers (older results) or for colocated k != n."""
    c, m, b, n = a.get("compute_s"), a.get("grad_bytes"), a.get("bandwidth_bytes_s"), a.get("workers")
    k = a.get("servers") or n
    if None in (c, m, b, n) or not b:
        return {"ps_bound_s": None, "ring_bound_s": None}
    ring = c + 2 * (n - 1) / n * m / b
    if a.get("placement") == "colocated":
        ps = ring if k == n else None
    else:
        ps = c + max(1.0, n / k) * m / b
    return {"ps_bound_s": ps, "ring_bound_s": ring}


FIXED = ("bsp", "wfbp", "fusion", "mgwfbp", "bytescheduler")


def auto_comparison(agg: list[dict], rows: list[dict]) -> list[dict]:
    """Each ``auto`` cell against the best fixed choice of the same model, workers, servers, placement,
    bandwidth and ratio over *both* backends (auto picks the backend too): plain strategies without
    layer-wise updates or compression, the choices auto has."""
    fixed = {r["strategy"] for r in rows if r.get("base_strategy") in FIXED and not r.get("layerwise")
             and not r.get("compression")}
    drop = ("backend",)
    out = []
    for a in agg:
        if not any(r["strategy"] == a["strategy"] and r.get("base_strategy") == "auto" for r in rows):
            continue
        peers = [b for b in agg if b["strategy"] in fixed and _gkey(b, drop) == _gkey(a, drop)]
        if not peers:
            continue
        best = min(peers, key=lambda b: b["step_s"])
        picks = sorted({_pick(r.get("auto_decision")) for r in rows
                        if r["strategy"] == a["strategy"] and _gkey(r) == _gkey(a)})
        out.append({**a, "picks": picks, "best": f"{best['backend']}:{best['strategy']}",
                    "best_step_s": best["step_s"], "over_best": a["step_s"] / best["step_s"]})
    return out


def _pick(d: dict | None) -> str:
    c = (d or {}).get("final")
    if not c:
        return "?"
    return f"{c['backend']}:{c['strategy']}" + (f" ({c['partition_bytes']} B)" if c["strategy"] == "bytescheduler"
                                                else "")


def _fmt_bw(b):
    return str(b)


def _key_label(a: dict, agg: list[dict]) -> str:
    """' (N KiB keys)' for a PS cell whose group ran more than one PS key size (a grid axis), else ''
    (each model's default key size differs with its scale, which is no axis); ' [auth A]' for a PS cell of a
    grid with more than one PUSHPULL_AUTH."""
    auth = ""
    if a["backend"] == "ps" and len({b.get("auth") for b in agg if b["backend"] == "ps"}) > 1:
        auth = f" [auth {a.get('auth')}]"
    return _size_label(a, agg) + auth


def _size_label(a: dict, agg: list[dict]) -> str:
    g = _gkey(a, drop=("ps_partition_bytes",))
    sizes = {b.get("ps_partition_bytes") for b in agg
             if b["backend"] == "ps" and _gkey(b, drop=("ps_partition_bytes",)) == g}
    if a["backend"] != "ps" or len(sizes) < 2 or not a.get("ps_partition_bytes"):
        return ""
    return f" ({a['ps_partition_bytes'] / 1024:g} KiB keys)"


def markdown(rows: list[dict], name: str, plots: list[str]) -> str:
    agg = aggregate(rows)
    modes = sorted({r.get("mode", "?") for r in rows})
    r0 = rows[0]
    # rows of several runs may differ in tries (a cell re-measured with more): name every shape
    shapes = sorted({(len(r.get("try_step_s", [])), len(r.get("try_step_s", [])) and
                      r["steps"] // max(1, len(r["try_step_s"]))) for r in rows})
    lines = [f"Generated by `pushpull bench report` from `{name}.jsonl` ({len(rows)} cells, emulation: "
             f"{', '.join(modes)}; gradients scaled to {r0.get('grad_mb')} MB per model, "
             f"{' or '.join(f'{t} tries of {s} steps' for t, s in shapes)} per cell).", "",
             "| model | backend | n | k | placement | bandwidth | ratio | strategy | step ms | "
             "throughput (samples/s) | speedup vs wfbp |",
             "|---|---|---:|---:|---|---|---:|---|---:|---:|---:|"]
    for a in agg:
        sp = f"{a['speedup']:.2f}x" if a["speedup"] else "-"
        ls = a.get("local_size") or 1
        workers = f"{a['workers']}x{ls}" if ls > 1 else a["workers"]
        strategy = a["strategy"] + (f" (local reduce {a.get('local_reduce')})" if ls > 1 else "") + _key_label(a, agg)
        lines.append(f"| {a['model']} | {a['backend']} | {workers} | "
                     f"{a['servers'] if a['backend'] == 'ps' else '-'} | {a['placement']} | {_fmt_bw(a['bandwidth'])} | "
                     f"{a['ratio']:g} | {strategy} | {a['step_s'] * 1e3:.0f} | "
                     f"{a['thr_mean']:.1f} ± {a['thr_std']:.1f} | {sp} |")
    cmp_ = backend_comparison(agg)
    if cmp_:
        has_ddp = any(c["ddp_step_s"] for c in cmp_)
        lines += ["", "PS against all-reduce (same model, strategy, workers, bandwidth, ratio), each against its "
                  "bound (c + M/B for PS on hosts of its own, c + 2(n-1)/n M/B colocated and for the ring; "
                  "c = compute, M = gradient bytes, B = link rate)" + (", and against PyTorch DDP (gloo, 25 MB "
                  "buckets) on the same hosts" if has_ddp else "") + ":", "",
                  "| model | strategy | n | k | placement | bandwidth | ratio | PS ms | PS bound ms | PS / bound | "
                  "all-reduce ms | ring bound ms | all-reduce / bound | PS speedup |" + (" DDP ms | PS vs DDP |"
                                                                                        if has_ddp else ""),
                  "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if has_ddp else "")]

        def ms(v):
            return f"{v * 1e3:.0f}" if v else "-"

        def ratio(x, y):
            return f"{x / y:.2f}x" if x and y else "-"
        for c in cmp_:
            line = (f"| {c['model']} | {c['strategy']}{_key_label(c, agg)} | {c['workers']} | {c['servers']} | {c['placement']} | "
                    f"{c['bandwidth']} | {c['ratio']:g} | {ms(c['step_s'])} | {ms(c['ps_bound_s'])} | "
                    f"{ratio(c['step_s'], c['ps_bound_s'])} | {ms(c['ar_step_s'])} | {ms(c['ring_bound_s'])} | "
                    f"{ratio(c['ar_step_s'], c['ring_bound_s'])} | {c['ps_over_ar']:.2f}x |")
            if has_ddp:
                line += f" {ms(c['ddp_step_s'])} | {ratio(c['ddp_step_s'], c['step_s'])} |"
            lines.append(line)
    lrc = local_reduce_comparison(agg)
    if lrc:
        lines += ["", "Local reduce against flat (same hosts, processes per host and strategy): step time, the "
                  "bound c + M/B of one reduction per host (c = compute, M = gradient bytes, B = link rate; the "
                  "flat path's is c + local_size x M/B), and every worker host's link bytes per step, sent / "
                  "received, read from its interface's counters:", "",
                  "| model | strategy | hosts x processes | k | placement | bandwidth | ratio | flat ms | "
                  "hierarchical ms | speedup | bound c + M/B ms | hierarchical / bound | flat bound ms | "
                  "flat MB/step per host (sent / received) | hierarchical MB/step per host | bytes hierarchical / "
                  "flat | local reduce in force (hier / flat) |",
                  "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]

        def mb(hosts):
            if not hosts:
                return "-"
            return ", ".join(f"{h['tx'] / 1e6:.2f} / {h['rx'] / 1e6:.2f}" for h in hosts)

        def share(h, f):
            if not h or not f:
                return "-"
            return ", ".join(f"{(x['tx'] + x['rx']) / (y['tx'] + y['rx']):.2f}" for x, y in zip(h, f))
        for c in lrc:
            b, fb = c["bound_s"], c["flat_bound_s"]
            bound = f"{b * 1e3:.0f} | {c['step_s'] / b:.2f}x" if b else "- | -"
            fbound = f"{fb * 1e3:.0f}" if fb else "-"
            lines.append(f"| {c['model']} | {c['strategy']} | {c['workers']} x {c['local_size']} | {c['servers']} | "
                         f"{c['placement']} | {c['bandwidth']} | {c['ratio']:g} | {c['flat_step_s'] * 1e3:.0f} | "
                         f"{c['step_s'] * 1e3:.0f} | {c['speedup_over_flat']:.2f}x | {bound} | {fbound} | "
                         f"{mb(c['flat_link_bytes'])} | {mb(c['link_bytes'])} | "
                         f"{share(c['link_bytes'], c['flat_link_bytes'])} | "
                         f"{'yes' if c['local_active'] else 'no'} / {'yes' if c['flat_local_active'] else 'no'} |")
    autos = auto_comparison(agg, rows)
    if autos:
        lines += ["", "`auto` against the best fixed choice of the cell (any backend; plain strategies):", "",
                  "| model | n | k | placement | bandwidth | ratio | auto started on | auto ms | auto's pick | "
                  "best fixed | best fixed ms | auto / best | within 10 % |",
                  "|---|---:|---:|---|---|---:|---|---:|---|---|---:|---:|---|"]
        for c in autos:
            lines.append(f"| {c['model']} | {c['workers']} | {c['servers']} | {c['placement']} | {c['bandwidth']} | "
                         f"{c['ratio']:g} | {c['backend']} | {c['step_s'] * 1e3:.0f} | {', '.join(c['picks'])} | "
                         f"{c['best']} | {c['best_step_s'] * 1e3:.0f} | {c['over_best']:.2f}x | "
                         f"{'yes' if c['over_best'] <= 1.10 else 'no'} |")
    scal = {}
    for r in rows:
        scal.setdefault(r["model"], (r.get("size_scale"), r.get("grad_bytes"), r.get("tensors")))
    lines += ["", "Scale: " + "; ".join(f"{m}: tensors x {s:.4g} = {b / 1e6:.1f} MB in {t} tensors"
                                         for m, (s, b, t) in scal.items() if s) + "."]
    if plots:
        lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines)


def plots(rows: list[dict], out_dir: Path, name: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(rows)
    made = []
    # bars: speedup per group
    groups, labels = [], []
    for a in agg:
        g = _gkey(a)
        if g not in groups:
            groups.append(g)
            labels.append(f"{g[0]}\n{g[1]} n={g[2]}\n{g[5]} r={g[6]:g}" + _key_label(a, agg).replace(" (", "\n(", 1))
    strategies = []
    for a in agg:
        if a["strategy"] not in strategies:
            strategies.append(a["strategy"])
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) + 2), 4))
    w = 0.8 / max(1, len(strategies))
    for i, s in enumerate(strategies):
        ys = []
        for g in groups:
            hit = [a for a in agg if _gkey(a) == g and a["strategy"] == s]
            ys.append(hit[0]["speedup"] if hit and hit[0]["speedup"] else 0)
        ax.bar([j + i * w for j in range(len(groups))], ys, w, label=s)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(groups))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speedup over wfbp (or the group's first strategy)")
    ax.set_title(f"{name}: speedup over the baseline")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fn = f"{name}_speedup.png"
    fig.savefig(out_dir / fn, dpi=110)
    plt.close(fig)
    made.append(fn)
    for axis, fname, xlabel in (("bandwidth", "bandwidth", "link bandwidth (bytes/s)"),
                                ("ratio", "ratio", "computation / communication ratio")):
        if len({a[axis] for a in agg}) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        lines: dict[tuple, list] = {}
        for a in agg:
            if a["speedup"] is None or a["strategy"] == a["baseline"]:
                continue
            k = (a["model"], a["backend"], a["workers"], a["placement"], a["strategy"]) + \
                ((a["ratio"],) if axis == "bandwidth" else (a["bandwidth"],))
            x = next(r["bandwidth_bytes_s"] for r in rows if r["bandwidth"] == a["bandwidth"]) \
                if axis == "bandwidth" else a["ratio"]
            lines.setdefault(k, []).append((x, a["speedup"]))
        for k, pts in lines.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label=f"{k[0]} {k[1]} {k[4]}" + (f" r={k[5]:g}" if axis == "bandwidth" else f" {k[5]}"))
        ax.set_xscale("log")
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(sorted({p[0] for pts in lines.values() for p in pts}))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("speedup over wfbp")
        ax.set_title(f"{name}: speedup vs {axis}")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fn = f"{name}_{fname}.png"
        fig.savefig(out_dir / fn, dpi=110)
        plt.close(fig)
        made.append(fn)
    return made


def write_page(out: str | Path, text: str, data: dict) -> None:
    """A benchmark's results page (markdown) at ``out`` and its data beside it (the same name, .json)."""
    import json

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))


def write_report(results: str | Path, out_dir: str | Path | None = None, title: str | None = None) -> Path:
    from pushpull.bench.grid import read_rows

    results = Path(results)
    rows = read_rows(results)
    if not rows:
        raise ValueError(f"{results}: no results")
    name = results.stem
    out_dir = Path(out_dir) if out_dir else results.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    made = plots(rows, out_dir, name)
    body = f"{BEGIN}\n{markdown(rows, name, made)}\n{END}"
    md = out_dir / f"{name}.md"
    if md.exists() and BEGIN in md.read_text() and END in md.read_text():
        text = md.read_text()
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        md.write_text(pre + body + post)
    else:
        md.write_text(f"# {title or name}\n\n{body}\n")
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench report", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="JSON-lines results of pushpull bench grid")
    p.add_argument("--out-dir", help="where to write <name>.md and the PNGs (default: next to RESULTS)")
    p.add_argument("--title", help="page title when the page is created")
    args = p.parse_args(argv)
    try:
        md = write_report(args.results, args.out_dir, args.title)
    except (ValueError, OSError) as ex:
        print(f"pushpull bench report: {ex}", file=sys.stderr)
        return 1
    print(f"pushpull bench report: wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
