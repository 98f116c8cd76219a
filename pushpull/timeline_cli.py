"""``pushpull timeline``: read the Chrome traces written with PUSHPULL_TRACE_ON=1.

``summarize FILE [--json]`` prints, per traced step, the step time, the
computation time (``compute`` events minus ``wait`` events: the training thread
blocked on communication is not computing), the communication time (the union
of ``comm`` events: push and pull of every partition, so parallel transfers
count once), how much of the communication overlapped computation, and the
rest (exposed communication). Overlap is what scheduling and the layer-wise
update buy; exposed communication is what is left to win.

``merge DIR -o OUT`` puts the per-rank files of one job into one trace (one
process per rank, aligned on wall-clock time) to view all workers together.

A simulator trace (``pushpull sim --trace``) has no step events; it is
summarized as one span covering the whole file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pushpull.cli import help_text
from pushpull.timeline import load_trace

Intervals = list[tuple[float, float]]

COMPUTE_CATS = {"compute"}
WAIT_CATS = {"wait"}
COMM_CATS = {"comm"}


# ---------------------------------------------------------------- interval algebra --

def union(iv) -> Intervals:
    """Sorted, disjoint cover of the given (start, end) intervals."""
    out: Intervals = []
    for a, b in sorted((a, b) for a, b in iv if b > a):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(u: Intervals) -> float:
    return sum(b - a for a, b in u)


def intersect(x: Intervals, y: Intervals) -> Intervals:
    """Intersection of two disjoint sorted interval lists."""
    out: Intervals = []
    i = j = 0
    while i < len(x) and j < len(y):
        a = max(x[i][0], y[j][0])
        b = min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: Intervals, y: Intervals) -> Intervals:
    """Parts of ``x`` not covered by ``y`` (both disjoint and sorted)."""
    out: Intervals = []
    j = 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k = j
        cur = a
        while k < len(y) and y[k][0] < b:
            if y[k][0] > cur:
                out.append((cur, y[k][0]))
            cur = max(cur, y[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def clip(u: Intervals, lo: float, hi: float) -> Intervals:
    return [(max(a, lo), min(b, hi)) for a, b in u if b > lo and a < hi]


# ---------------------------------------------------------------- summary --

def _spans(events: list[dict], cats: set[str]) -> Intervals:
    return union((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events
                 if e.get("ph") == "X" and e.get("cat") in cats)


def summarize_process(events: list[dict]) -> list[dict]:
    """Per-step numbers (milliseconds) for the events of one process."""
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "step"), key=lambda e: e["ts"])
    xs = [e for e in events if e.get("ph") == "X"]
    if not xs:
        return []
    if steps:
        windows = [(e.get("args", {}).get("step", e["name"]), e["ts"], e["ts"] + e.get("dur", 0.0)) for e in steps]
    else:
        windows = [("all", min(e["ts"] for e in xs), max(e["ts"] + e.get("dur", 0.0) for e in xs))]
    compute_all = subtract(_spans(xs, COMPUTE_CATS), _spans(xs, WAIT_CATS))
    comm_all = _spans(xs, COMM_CATS)
    rows = []
    for step, lo, hi in windows:
        compute = clip(compute_all, lo, hi)
        comm = clip(comm_all, lo, hi)
        overlap = length(intersect(compute, comm))
        c, m = length(compute), length(comm)
        rows.append({
            "step": step,
            "time_ms": round((hi - lo) / 1e3, 3),
            "compute_ms": round(c / 1e3, 3),
            "comm_ms": round(m / 1e3, 3),
            "overlap_ms": round(overlap / 1e3, 3),
            "exposed_comm_ms": round((m - overlap) / 1e3, 3),
            "overlap_pct": round(100.0 * overlap / m, 1) if m > 0 else 0.0,
        })
    return rows


def _mean(rows: list[dict]) -> dict:
    keys = ["time_ms", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms"]
    if not rows:
        return {}
    out = {k: round(sum(r[k] for r in rows) / len(rows), 3) for k in keys}
    out["overlap_pct"] = round(100.0 * out["overlap_ms"] / out["comm_ms"], 1) if out["comm_ms"] > 0 else 0.0
    return out


def summarize(events: list[dict]) -> list[dict]:
    """One entry per process (pid) that has compute, communication or step events."""
    names = {e["pid"]: e.get("args", {}).get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    by_pid: dict[int, list[dict]] = {}
    for e in events:
        by_pid.setdefault(e.get("pid", 0), []).append(e)
    out = []
    for pid in sorted(by_pid):
        evs = by_pid[pid]
        if not any(e.get("cat") in COMPUTE_CATS | COMM_CATS | {"step"} for e in evs):
            continue  # e.g. a simulated server's summation track
        rows = summarize_process(evs)
        out.append({"pid": pid, "name": names.get(pid) or f"pid {pid}", "steps": rows, "mean": _mean(rows)})
    return out


def format_summary(path: str, procs: list[dict]) -> str:
    cols = [("step", "step", 6), ("time_ms", "time ms", 9), ("compute_ms", "compute", 9), ("comm_ms", "comm", 9),
            ("overlap_ms", "overlap", 9), ("exposed_comm_ms", "exposed", 9), ("overlap_pct", "overlap%", 9)]
    lines = [f"{path}"]
    for p in procs:
        lines.append(f"  {p['name']}: {len(p['steps'])} step(s); times in ms; overlap = communication "
                     f"while computing")
        lines.append("  " + " ".join(f"{h:>{w}}" for _, h, w in cols))
        for r in p["steps"] + ([dict(p["mean"], step="mean")] if len(p["steps"]) > 1 else []):
            lines.append("  " + " ".join(
                f"{r[k]:>{w}}" if k == "step" else f"{r[k]:>{w}.1f}" for k, _, w in cols))
    return "\n".join(lines)


# ---------------------------------------------------------------- merge --

def merge(paths: list[Path]) -> dict:
    """One trace from several processes' files, shifted onto a common clock."""
    loaded = [(p, *load_trace(p)) for p in paths]
    t0s = [m.get("t0_unix_us") for _, _, m in loaded]
    base = min((t for t in t0s if t is not None), default=None)
    events: list[dict] = []
    for (p, evs, meta), t0 in zip(loaded, t0s):
        shift = (t0 - base) if (t0 is not None and base is not None) else 0.0
        for e in evs:
            if "ts" in e and shift:
                e = dict(e, ts=round(e["ts"] + shift, 3))
            events.append(e)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"merged_from": [str(p) for p in paths]}}


# ---------------------------------------------------------------- CLI --

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pushpull timeline", description=help_text(__doc__.split("\n\n")[0]))
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize", help="per-step compute, communication and overlap")
    s.add_argument("file", help="a timeline.json written with PUSHPULL_TRACE_ON=1 (or by pushpull sim)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    m = sub.add_parser("merge", help="merge the per-rank timelines of a trace directory into one file")
    m.add_argument("dir", help="the trace directory (PUSHPULL_TRACE_DIR), holding <rank>/timeline.json")
    m.add_argument("-o", "--output", required=True, help="where to write the merged trace")
    args = ap.parse_args(argv)
    if args.cmd == "summarize":
        try:
            events, _ = load_trace(args.file)
        except (OSError, ValueError, KeyError) as e:
            print(f"pushpull timeline: cannot read {args.file}: {e}", file=sys.stderr)
            return 2
        procs = summarize(events)
        if args.json:
            print(json.dumps({"file": args.file, "processes": procs}, indent=1))
        else:
            print(format_summary(args.file, procs))
        return 0
    paths = sorted(Path(args.dir).glob("*/timeline.json"), key=lambda p: (len(p.parent.name), p.parent.name))
    if not paths:
        print(f"pushpull timeline: no <rank>/timeline.json under {args.dir}", file=sys.stderr)
        return 2
    Path(args.output).write_text(json.dumps(merge(paths)))
    print(f"merged {len(paths)} timeline(s) into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
