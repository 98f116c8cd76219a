"""Predicted vs measured step times, cell by cell.

The emulated-cluster benchmarks measure step times; this turns a list of
those measurements into the simulator's error per cell, the median absolute
error and the worst cell, so the simulator's claims can be checked against
something that really moved bytes.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from pushpull.profiles import LayerProfile, Profile, TensorSpec, load_profile
from pushpull.sim.config import (ClusterConfig, CpuCosts, SimOptions, format_bandwidth, parse_bandwidth, parse_bytes,
                                 parse_duration)
from pushpull.sim.events import simulate
from pushpull.sim.executors import MGWFBP, ByteScheduler, make_strategy

REQUIRED = ("model", "strategy", "backend", "workers", "bandwidth", "measured_step_s")
UNLIMITED = 1 << 40   # the benchmark grid's "whole" / "inf"


@dataclass
class ValidationTable:
    rows: list[dict] = field(default_factory=list)

    @property
    def median_abs_error(self) -> float:
        errs = [abs(r["error"]) for r in self.rows]
        return statistics.median(errs) if errs else math.nan

    @property
    def worst(self) -> dict | None:
        return max(self.rows, key=lambda r: abs(r["error"]), default=None)

    def to_markdown(self) -> str:
        head = ("| model | strategy | backend | workers | servers | bandwidth | compute x | measured ms "
                "| predicted ms | error |\n|---|---|---|---:|---:|---|---:|---:|---:|---:|")
        lines = [head]
        for r in self.rows:
            lines.append(f"| {r['model']} | {r['strategy']} | {r['backend']} | {r['workers']} | "
                         f"{r['servers'] if r['backend'] == 'ps' else '-'} | {format_bandwidth(r['bandwidth_bytes_s'])} | "
                         f"{r['compute_scale']:g} | {r['measured_step_s'] * 1e3:.1f} | "
                         f"{r['predicted_step_s'] * 1e3:.1f} | {r['error'] * 100:+.1f} % |")
        if self.rows:
            w = self.worst
            lines.append("")
            lines.append(f"median absolute error {self.median_abs_error * 100:.1f} % over {len(self.rows)} cells; "
                         f"worst cell {w['model']}/{w['strategy']}/{w['backend']} n={w['workers']} "
                         f"{format_bandwidth(w['bandwidth_bytes_s'])}: {w['error'] * 100:+.1f} %")
        return "\n".join(lines)


def scaled_profile(profile: Profile, size_scale: float) -> Profile:
    """``profile`` with every tensor's element count times ``size_scale``, rounded per tensor
    (at least one element) exactly as the emulated cluster's model builds its parameters."""
    if size_scale == 1.0:
        return profile
    return Profile(model=profile.model, batch_size=profile.batch_size, device=profile.device,
                   source=profile.source, layers=[
                       LayerProfile(l.name, l.fwd_s, l.bwd_s,
                                    [TensorSpec(t.name, max(1, int(round(t.numel * size_scale))), t.dtype)
                                     for t in l.tensors])
                       for l in profile.layers])


def _credit(v, where: str) -> float:
    if isinstance(v, str):
        if v.lower() in ("inf", "none", "unlimited", "whole"):
            return math.inf
        return float(parse_bytes(v, where))
    return math.inf if v >= UNLIMITED else float(v)


def cell(row: dict, i: int = 0, profiles: dict | None = None, latency: float = 50e-6):
    """(profile, cluster, strategy, options) that replay one measured cell; see :func:`validate`."""
    where = f"measured_rows[{i}]"
    cache = profiles if profiles is not None else {}
    prof = row.get("profile")
    if prof is None:
        model = str(row["model"])
        if model not in cache:
            cache[model] = load_profile(model)
        prof = cache[model]
    scale = float(row.get("size_scale") or 1.0)
    if scale != 1.0:
        key = (id(prof), scale)
        if key not in cache:
            cache[key] = scaled_profile(prof, scale)
        prof = cache[key]
    bw = parse_bandwidth(row["bandwidth"], f"{where}.bandwidth")
    lat = parse_duration(row.get("latency", latency), f"{where}.latency")
    msg = parse_duration(row.get("message_s") or 0.0, f"{where}.message_s")
    servers = row.get("servers")
    colocated = bool(row.get("colocated", row.get("placement") == "colocated"))
    extra = {}
    if row.get("ps_partition_bytes"):
        extra["ps_partition_bytes"] = int(parse_bytes(row["ps_partition_bytes"], f"{where}.ps_partition_bytes"))
    cpu = row.get("cpu_costs")
    if isinstance(cpu, dict):
        extra["cpu"] = CpuCosts(**cpu)
    elif isinstance(cpu, CpuCosts):
        extra["cpu"] = cpu
    cluster = ClusterConfig(workers=int(row["workers"]), servers=int(servers) if servers else None, bandwidth=bw,
                            backend=str(row["backend"]), latency=lat, colocated=colocated,
                            local_size=int(row.get("local_size", 1)), message_s=msg,
                            local_reduce=bool(row.get("local_reduce_active", row.get("local_reduce") != "off")),
                            **extra)
    strat = make_strategy(str(row.get("base_strategy") or row["strategy"]))
    if isinstance(strat, ByteScheduler):
        if row.get("partition_bytes"):
            p = row["partition_bytes"]
            strat.partition_bytes = (int(p) if not isinstance(p, str) else parse_bytes(p, f"{where}.partition_bytes"))
            if strat.partition_bytes >= UNLIMITED:
                strat.partition_bytes = UNLIMITED   # "whole": every tensor is one partition
        if row.get("credit_bytes"):
            strat.credit_bytes = _credit(row["credit_bytes"], f"{where}.credit_bytes")
    if isinstance(strat, MGWFBP) and row.get("groups"):
        strat.plan = [int(g) for g in row["groups"]]
    opts = SimOptions(layerwise_update=bool(row.get("layerwise", True)),
                      compute_scale=float(row.get("compute_scale", 1.0)), trace=False,
                      compute_clock=str(row.get("compute_clock", "sequential")),
                      update_s=float(row.get("update_s") or 0.0), step_call_s=float(row.get("step_call_s") or 0.0),
                      wake_s=float(row.get("wake_s") or 0.0))
    return prof, cluster, strat, opts


def validate(measured_rows, profiles: dict[str, Profile] | None = None, latency: float = 50e-6) -> ValidationTable:
    """Simulate every measured cell as it ran and compare.

    Each row is a dict with ``model`` (shipped profile name or path),
    ``strategy``, ``backend``, ``workers``, ``servers``, ``bandwidth``
    (``10gbit`` or bytes/s: the nominal rate or a measured effective one) and
    ``measured_step_s``. What the cell ran, all optional:

    * ``profile`` (a Profile, instead of loading ``model``), ``size_scale``
      (tensor sizes scaled as the emulated model scales them), ``compute_scale``;
    * ``base_strategy`` (what to simulate when ``strategy`` is a label such as
      ``bytescheduler+lw``), ``partition_bytes``, ``credit_bytes`` (``inf``
      or >= 2**40: unlimited; a partition >= 2**40: whole tensors), ``groups``
      (MG-WFBP buffer sizes in gradients, ready order: the plan the run used);
    * ``layerwise`` (default True: layer-wise updates), ``compute_clock``
      (``deadline`` for the emulated cluster's sleep replay);
    * ``colocated`` or ``placement``, ``local_size``, ``local_reduce_active`` (or ``local_reduce``:
      ``off`` = each process pushes everything), ``ps_partition_bytes``;
    * calibration: ``latency`` (s per message), ``message_s`` (per-message
      CPU time, see ClusterConfig), ``cpu_costs`` (a CpuCosts or its fields
      as a dict: CPU per byte and cores); the optimizer on the training thread:
      ``update_s`` (per tensor, layer-wise updates), ``step_call_s`` (per
      ``step()`` call), ``wake_s`` (per wait that blocks), see SimOptions.

    ``profiles`` maps model names to Profile objects to use instead of
    loading them. ``error`` is (predicted - measured) / measured; every other
    key of the row is kept in the result row under ``cell``.
    """
    cache: dict = dict(profiles or {})
    table = ValidationTable()
    for i, row in enumerate(measured_rows):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"measured_rows[{i}]: missing {', '.join(missing)}")
        measured = float(row["measured_step_s"])
        if not measured > 0:
            raise ValueError(f"measured_rows[{i}].measured_step_s must be > 0, got {row['measured_step_s']!r}")
        prof, cluster, strat, opts = cell(row, i, cache, latency)
        res = simulate(prof, cluster, strat, options=opts)
        table.rows.append({
            "model": str(row["model"]), "strategy": str(row["strategy"]), "backend": cluster.backend,
            "workers": cluster.workers, "servers": cluster.servers, "bandwidth_bytes_s": cluster.bandwidth,
            "compute_scale": opts.compute_scale, "measured_step_s": measured, "predicted_step_s": res.iteration_s,
            "error": (res.iteration_s - measured) / measured, "cell": row,
        })
    return table
