"""Where each byte's CPU goes, as a picture: CPU-seconds per GB that crossed a process's sockets, per role and
PUSHPULL_AUTH mode (with and without the data lanes), beside a raw TCP stream's and a gloo rank's, from the
rows ``pushpull bench wire --json`` wrote (the latest run in the file by default).

    python benchmarks/line_rate_plot.py docs/results/line_rate.jsonl --out docs/results/line_rate_cpu.png
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def latest_run(rows: list[dict]) -> list[dict]:
    """The rows of the last invocation in the file (the same argv, consecutive at the end)."""
    if not rows:
        return []
    argv = rows[-1].get("argv")
    out = []
    for r in reversed(rows):
        if r.get("argv") != argv:
            break
        out.append(r)
    return out[::-1]


def per_role(rows: list[dict]) -> dict:
    """(transport, label) -> {"worker": mean CPU/GB per socket byte, "server": ...}; label is the auth mode
    (push_pull), or "raw" / "gloo" for the bounds."""
    acc: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("transport") in (None, "-") or r.get("cpu_per_gb_socket") is None:
            continue
        label = r["auth"] if r["method"] == "push_pull" else r["method"]
        role = "server" if str(r["role"]).startswith("server") else "worker"
        acc[(r["transport"], label)][role].append(float(r["cpu_per_gb_socket"]))
    return {k: {role: statistics.mean(v) for role, v in d.items()} for k, d in acc.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", help="a pushpull bench wire --json file")
    p.add_argument("--out", default="docs/results/line_rate_cpu.png")
    a = p.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(a.rows) as f:
        rows = latest_run([json.loads(line) for line in f if line.strip()])
    data = per_role(rows)
    transports = sorted({t for t, _ in data}, key=lambda t: (t != "loopback", t))
    fig, axes = plt.subplots(1, len(transports), figsize=(6 * len(transports), 4), squeeze=False)
    for ax, t in zip(axes[0], transports):
        labels = [lab for tt, lab in data if tt == t and lab not in ("raw", "gloo")]
        order = sorted(labels, key=lambda s: (s.split("+")[0], "+" in s))
        x = range(len(order))
        w = [data[(t, lab)].get("worker", 0) for lab in order]
        s = [data[(t, lab)].get("server", 0) for lab in order]
        ax.bar([i - 0.2 for i in x], w, 0.4, label="push_pull worker")
        ax.bar([i + 0.2 for i in x], s, 0.4, label="push_pull server")
        for bound, style in (("raw", ":"), ("gloo", "--")):
            if (t, bound) in data:
                v = statistics.mean(data[(t, bound)].values())
                ax.axhline(v, linestyle=style, color="black", linewidth=1,
                           label=f"{'raw TCP stream' if bound == 'raw' else 'gloo rank'} {v:.2f}")
        ax.set_xticks(list(x))
        ax.set_xticklabels([lab.replace("+zmq", "\n(ZeroMQ)") for lab in order], fontsize=8)
        ax.set_ylabel("CPU-s per GB through the process's sockets")
        ax.set_title(f"{t}: PUSHPULL_AUTH (data lanes unless marked ZeroMQ)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
