"""Validate the simulator against the emulated-cluster grid results.

    python benchmarks/validate_sim.py docs/results/bytescheduler_speedup.jsonl docs/results/ddl_benchmarks.jsonl \
        docs/results/how_useful.jsonl [--write docs/results/simulator.md] [--json errors.json]

Every measured cell (``pushpull bench grid`` row) goes to
``pushpull.sim.validate.validate`` with what the cell really ran (the row's
``size_scale``, ``compute_scale``, ``layerwise``, placement, link rate, PS key
size, ByteScheduler partition and credit, the MG-WFBP plan it settled on, and
the emulated model's deadline clock); repeats of a cell (separate launches
with the same plan) are averaged.

Five columns of errors:

* **uncalibrated**: the simulator's defaults: nominal link rate, 50 µs
  per-message latency, no per-message CPU cost, free server summation;
* **+host probe**: the same, with the per-call cost of a tiny reduction that
  a user measures on their own machine *before* the run, without the cluster
  (``pushpull bench probe --workers N``, over loopback, with the job's
  processes per machine: ``--host-probe``, default
  ``docs/results/host_probe.jsonl``), mapped to ``message_s`` and ``latency``
  as the ``auto`` strategy maps its probes
  (:func:`pushpull.sim.config.per_call_costs`); nominal link rate; nothing
  from the job;
* **rate-calibrated**: the link rate scaled so that the simulator's time for
  one reduction of all the gradient bytes as one buffer equals the measured
  ``t_comm_s`` (TCP goodput, CPU per byte, and the workers' desynchronisation
  when everything is in flight);
* **rate+message-calibrated**: that rate, plus the job's own small-reduction
  probes (``t_small_s`` alone, ``t_stream_s`` per reduction in a stream of
  16) mapped to ``message_s`` and ``latency`` as the ``auto`` strategy maps
  its start-up probes (:func:`pushpull.sim.config.per_call_costs`);
* **+optimizer (probe)**: that, plus the optimizer's own cost on the training
  thread (``SimOptions.update_s``, ``step_call_s``, ``wake_s``) from
  :func:`pushpull.bench.layerwise_probe.layerwise_probe`, which runs with communication
  taken out: the job's own probe (``opt_probe`` in rows of newer jobs) or else
  the standalone one of the same model and backend
  (``benchmarks/layerwise_probe.py`` -> ``--opt-probe``, default
  ``docs/results/layerwise_probe.jsonl``).

All numbers are probes (the host probe before any job, on this machine; the others
every job runs on its own cluster before its timed steps; the optimizer probe also
standalone), so nothing is fitted to the step times.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from pushpull.profiles import LayerProfile, Profile, TensorSpec
from pushpull.sim.config import per_call_costs
from pushpull.sim.events import simulate
from pushpull.sim.validate import ValidationTable, cell, validate

BEGIN = "<!-- validation:begin -->"
END = "<!-- validation:end -->"
LABELS = ["uncalibrated", "+host probe", "rate-calibrated", "rate+message-calibrated", "+optimizer (probe)",
          "+CPU per byte (host probe)", "+host probe with CPU per byte"]
SHORT = ["uncalibrated", "+host probe", "rate-calibrated", "rate+message", "+optimizer", "+cpu", "+host probe+cpu"]
OPT_FIELDS = ("update_lw_s", "step_lw_s", "step_s", "wake_s")
OPT_PROBE = "docs/results/layerwise_probe.jsonl"
HOST_PROBE = "docs/results/host_probe.jsonl"


def plan_groups(plan: str | None) -> list[int] | None:
    """``"mgwfbp: 3 buffer(s) of [7, 87, 67] gradients"`` (a grid row's plan) -> [7, 87, 67]."""
    m = re.search(r"buffer\(s\) of \[([0-9, ]+)\]", plan or "")
    return [int(x) for x in m.group(1).split(",")] if m else None


def _delay_s(row: dict) -> float:
    if not row.get("delay"):
        return 0.0
    from pushpull.emulate.netns import parse_time

    return parse_time(str(row["delay"]))


def replay_row(row: dict) -> dict:
    """A grid row as :func:`pushpull.sim.validate.validate` takes it: what the cell ran. A cell with a
    configured one-way delay gets it as the per-message latency (plus the default 50 µs): a user knows
    the path's round trip (ping) before running anything."""
    extra = {}
    if row.get("delay"):
        extra["latency"] = _delay_s(row) + 50e-6
    return {**row, **extra, "measured_step_s": float(row["step_s"]), "bandwidth": float(row["bandwidth_bytes_s"]),
            "layerwise": bool(row.get("layerwise")), "compute_clock": "deadline",
            "ps_partition_bytes": int(row.get("ps_partition_bytes") or 4_096_000),
            "groups": plan_groups(row.get("plan")) if row.get("base_strategy") == "mgwfbp" else None}


def one_buffer_s(row: dict) -> float:
    """The simulator's time for the job's calibration reduction: all gradient bytes as one tensor."""
    _, cluster, _, _ = cell(row)
    prof = Profile(model="one-buffer", batch_size=1, device="-", source="-",
                   layers=[LayerProfile("all", 1e-9, 1e-9, [TensorSpec("all", int(row["grad_bytes"]) // 4)])])
    return simulate(prof, cluster, "bsp", layerwise_update=False, trace=False).iteration_s


def calibrated(row: dict, level: str) -> dict:
    """``row`` with the cluster's numbers taken from the probes the job ran before its steps.

    * ``message``: :func:`pushpull.sim.config.per_call_costs` of the job's own probes, as the
      ``auto`` strategy maps its start-up probes (PS: the per-message CPU time is the time per
      reduction in a stream of small ones, ``t_stream_s``, and the latency what an isolated small
      reduction, ``t_small_s``, takes beyond that, over a push and a pull; all-reduce, whose
      backend fuses the stream: half of ``t_small_s`` is one collective's 2(n-1) latencies, the
      other half rank 0's order message), at least the default 50 µs.
    * ``rate``: the link rate scaled so that the simulator's time for one reduction of all
      the gradient bytes as one buffer equals the measured ``t_comm_s``.
    """
    r = dict(row)
    if level in ("message", "rate+message"):
        lat, msg = per_call_costs(row["backend"], int(row["workers"]), row["t_small_s"],
                                  row.get("t_stream_s") or row["t_small_s"])
        r["message_s"] = msg
        r["latency"] = max(50e-6, lat)
    if level in ("rate", "rate+message"):
        bw = float(row["bandwidth"])
        for _ in range(3):   # fixed point: the one-buffer reduction takes the measured t_comm
            bw *= one_buffer_s({**r, "bandwidth": bw}) / row["t_comm_s"]
        r["bandwidth"] = bw
    return r


def read_host_probes(path: str | None) -> dict[tuple, dict]:
    """(backend, workers) -> ``pushpull bench probe`` rows for it, ``t_small_s`` and ``t_stream_s``
    averaged over the runs in the file; under the key ``"cpu"`` the latest row with the CPU cost per
    byte (``cpu_*`` fields; a ``--cpu-only`` row has no per-call figures)."""
    runs: dict[tuple, list[dict]] = {}
    out: dict = {}
    if path and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if "cpu_tcp_send" in r:
                    out["cpu"] = r
                if "t_small_s" in r:
                    runs.setdefault((r["backend"], int(r["workers"])), []).append(r)
    out.update({k: {"t_small_s": statistics.mean(r["t_small_s"] for r in v),
                    "t_stream_s": statistics.mean(r["t_stream_s"] for r in v), "runs": len(v)}
                for k, v in runs.items()})
    return out


def cpu_costs(row: dict, probe: dict | None) -> dict | None:
    """The CPU charge of a grid cell from the host probe's CPU figures: the emulated cluster runs every
    host's processes on one machine, so they share its ``cpus`` cores; the PS pays for encryption where the
    job's PUSHPULL_AUTH encrypts between hosts (``auto``, the default, and ``curve``), the ring never: CURVE
    over ZeroMQ, or AES-128-GCM where the row says its data went over lanes (``data_lanes``, recorded by grids
    since session 13; an older row's data went over ZeroMQ)."""
    if not probe:
        return None
    from pushpull.sim.config import CpuCosts

    auth = str(row.get("auth") or "auto")
    lanes = bool(row.get("data_lanes"))
    c = CpuCosts.from_probe(probe, encryption="auto" if auth in ("auto", "curve") else "none",
                            shared_cores=float(row.get("cpus") or probe.get("cpus") or 1), data_lane=lanes)
    return None if c is None else dict(c.__dict__)


def with_host_probe(row: dict, probes: dict[tuple, dict], cpu: bool = False) -> dict:
    """``row`` (uncalibrated) with the per-call costs the host probe measured for its backend and
    number of workers before any run (the path's delay, where the cell has one, stays added to the
    latency); unchanged, and marked, where no probe matches. ``cpu``: also its CPU cost per byte
    (:func:`cpu_costs`), where the probe has it."""
    extra = {}
    if cpu:
        c = cpu_costs(row, probes.get("cpu"))
        if c is not None:
            extra["cpu_costs"] = c
    pr = probes.get((row["backend"], int(row["workers"])))
    if not pr:
        return dict(row, host_probe=False, **extra)
    lat, msg = per_call_costs(row["backend"], int(row["workers"]), pr["t_small_s"], pr["t_stream_s"])
    return dict(row, latency=_delay_s(row) + lat, message_s=msg, host_probe=True, **extra)


def with_cpu(row: dict, probes: dict) -> dict:
    """``row`` (uncalibrated) with only the host probe's CPU cost per byte."""
    c = cpu_costs(row, probes.get("cpu"))
    return row if c is None else dict(row, cpu_costs=c)


def read_opt_probes(path: str | None) -> dict[tuple, dict]:
    """(model, backend) -> the latest ``benchmarks/layerwise_probe.py`` row for it."""
    out: dict[tuple, dict] = {}
    if path and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[(r["model"], r["backend"])] = r
    return out


def with_optimizer(row: dict, probes: dict[tuple, dict]) -> dict:
    """``row`` with the optimizer's cost on the training thread, from the job's own probe
    (``opt_probe``, rank 0's) or else from the standalone probe of the same model and backend:
    layer-wise runs pay ``update_lw_s`` per tensor in the forward pre-hooks and ``step_lw_s`` per
    step(); the others ``step_s`` per step() (wait_all + one optimizer step); both ``wake_s`` per
    wait that blocks."""
    pr = row.get("opt_probe") if isinstance(row.get("opt_probe"), dict) and "step_s" in row["opt_probe"] \
        else probes.get((row["model"], row["backend"]))
    if not pr:
        return row
    r = dict(row, wake_s=pr.get("wake_s") or 0.0)
    if row.get("layerwise"):
        r.update(update_s=pr["update_lw_s"], step_call_s=pr["step_lw_s"])
    else:
        r.update(step_call_s=pr["step_s"])
    return r


def tables(rows: list[dict], probes: dict[tuple, dict] | None = None,
           host: dict[tuple, dict] | None = None) -> list[ValidationTable]:
    base = [replay_row(r) for r in rows]
    msg = [calibrated(r, "rate+message") for r in base]
    out = [validate(base), validate([with_host_probe(r, host or {}) for r in base]),
           validate([calibrated(r, "rate") for r in base]), validate(msg),
           validate([with_optimizer(r, probes or {}) for r in msg])]
    if (host or {}).get("cpu"):   # the CPU cost per byte, alone and with the per-call costs
        out += [validate([with_cpu(r, host) for r in base]),
                validate([with_host_probe(r, host, cpu=True) for r in base])]
    return out


def combined_markdown(rows: list[dict], tables: list[ValidationTable]) -> str:
    lines = ["| config | model | strategy | backend | n | k | bandwidth | compute x | measured ms | "
             + " | ".join(f"{l} ms | error" for l in SHORT[:len(tables)]) + " |",
             "|---|---|---|---|---:|---:|---|---:|---:|" + "---:|---:|" * len(tables)]
    for i, r in enumerate(rows):
        u = tables[0].rows[i]
        cells = " | ".join(f"{t.rows[i]['predicted_step_s'] * 1e3:.0f} | {t.rows[i]['error'] * 100:+.1f} %"
                           for t in tables)
        ls = int(r.get("local_size") or 1)  # processes per host: hierarchical (local reduce) or flat
        n = f"{u['workers']}x{ls} {'hier' if r.get('local_reduce_active') else 'flat'}" if ls > 1 else u["workers"]
        lines.append(f"| {r.get('config')} | {u['model']} | {u['strategy']} | {u['backend']} | {n} | "
                     f"{u['servers'] if u['backend'] == 'ps' else '-'} | {r['bandwidth']} | {round(u['compute_scale'], 4):g} | "
                     f"{u['measured_step_s'] * 1e3:.0f} | {cells} |")
    return "\n".join(lines)


def summary(t: ValidationTable, label: str) -> str:
    w = t.worst
    beyond = sum(1 for r in t.rows if abs(r["error"]) > 0.30)
    return (f"{label}: median absolute error {t.median_abs_error * 100:.1f} % over {len(t.rows)} cells, worst "
            f"{w['model']}/{w['strategy']}/{w['backend']} {w['error'] * 100:+.1f} %, {beyond} beyond 30 %")


def merge_repeats(rows: list[dict]) -> list[dict]:
    """One row per cell: repeats of a cell (separate launches) merged, the step time and the calibration
    probes averaged (``t_stream_s`` over the repeats that measured it)."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple(str(r.get(k)) for k in ("config", "model", "strategy", "backend", "workers", "servers",
                                              "placement", "bandwidth", "ratio", "grad_mb", "ps_partition_bytes",
                                              "plan", "local_size", "local_reduce"))
        cells.setdefault(key, []).append(r)
    out = []
    for rs in cells.values():
        m = dict(rs[0])
        m["step_s"] = statistics.mean(r["step_s"] for r in rs)
        for k in ("t_comm_s", "t_small_s", "t_stream_s"):
            vals = [r[k] for r in rs if r.get(k)]
            m[k] = statistics.mean(vals) if vals else None
        probes = [r["opt_probe"] for r in rs if isinstance(r.get("opt_probe"), dict) and "step_s" in r["opt_probe"]]
        vals = {k: [pr[k] for pr in probes if pr.get(k) is not None] for k in OPT_FIELDS}
        m["opt_probe"] = {k: statistics.mean(v) for k, v in vals.items() if v} if probes else None
        m["repeats"] = len(rs)
        out.append(m)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="grid results (JSON lines)")
    p.add_argument("--write", help="replace the generated part of this page's validation section")
    p.add_argument("--json", help="also write the per-cell errors here")
    p.add_argument("--host-probe", default=HOST_PROBE,
                   help=f"per-call costs measured on this machine before any run (pushpull bench probe --out; "
                        f"default {HOST_PROBE})")
    p.add_argument("--opt-probe", default=OPT_PROBE,
                   help=f"optimizer-cost probes (benchmarks/layerwise_probe.py) for cells without their own "
                        f"(default {OPT_PROBE})")
    a = p.parse_args(argv)
    rows = []
    for f in a.results:
        rows += [json.loads(l) for l in Path(f).read_text().splitlines() if l.strip()]
    # ddp (PyTorch's DistributedDataParallel, a peer in the grid) has no model in the simulator
    rows = merge_repeats([r for r in rows if r.get("mode") == "namespaces" and not r.get("compression")
                          and r.get("base_strategy") != "ddp"])
    host = read_host_probes(a.host_probe)
    tabs = tables(rows, read_opt_probes(a.opt_probe), host)
    labels = LABELS[:len(tabs)]
    md = combined_markdown(rows, tabs)
    sums = [summary(t, l) for t, l in zip(tabs, labels)]
    unprobed = sum(1 for r in tabs[1].rows if not r["cell"].get("host_probe"))
    if unprobed:
        sums[1] += f" ({unprobed} cells without a host probe of their backend and size: uncalibrated there)"
    print(md)
    print()
    print("\n".join(sums))
    by = {}
    for i, r in enumerate(rows):
        by.setdefault((r["backend"], r["base_strategy"]), []).append([t.rows[i]["error"] for t in tabs])
    groups = ["| backend | strategy | cells | " + " | ".join(f"median error, {l}" for l in labels) + " |",
              "|---|---|---:|" + "---:|" * len(labels)]
    for k, v in sorted(by.items()):
        groups.append(f"| {k[0]} | {k[1]} | {len(v)} | " + " | ".join(
            f"{statistics.median(e[j] for e in v) * 100:+.1f} %" for j in range(len(labels))) + " |")
    print("\n".join(groups))
    if a.json:
        Path(a.json).write_text(json.dumps(dict(zip(labels, ([{k: v for k, v in r.items() if k != "cell"}
                                                               for r in t.rows] for t in tabs))), indent=1))
    if a.write:
        page = Path(a.write)
        text = page.read_text()
        body = (f"{BEGIN}\nGenerated by `python benchmarks/validate_sim.py {' '.join(a.results)} --write {a.write}`.\n\n"
                + "\n".join(f"* {x}" for x in sums) + "\n\nMedian signed error by backend and strategy:\n\n"
                + "\n".join(groups) + f"\n\nPer cell:\n\n{md}\n{END}")
        if BEGIN in text:
            pre, rest = text.split(BEGIN, 1)
            text = pre + body + rest.split(END, 1)[1]
        else:
            raise SystemExit(f"{page}: no {BEGIN} marker; add one to the validation section first")
        page.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
