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

from pushpull.profiles import Profile, load_profile
from pushpull.sim.config import ClusterConfig, format_bandwidth, parse_bandwidth, parse_bytes, parse_duration
from pushpull.sim.engine import simulate
from pushpull.sim.strategies import ByteScheduler, make_strategy

REQUIRED = ("model", "strategy", "backend", "workers", "bandwidth", "measured_step_s")


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


def validate(measured_rows, profiles: dict[str, Profile] | None = None, latency: float = 50e-6) -> ValidationTable:
    """Simulate every measured cell and compare.

    Each row is a dict with ``model`` (shipped profile name or path),
    ``strategy``, ``backend``, ``workers``, ``servers``, ``bandwidth``
    (``10gbit`` or bytes/s), ``compute_scale`` and ``measured_step_s``;
    optional ``latency``, ``partition_bytes``, ``credit_bytes``,
    ``colocated``, ``local_size``. ``profiles`` maps
    model names to Profile objects to use instead of loading them.
    ``error`` is (predicted - measured) / measured.
    """
    cache: dict[str, Profile] = dict(profiles or {})
    table = ValidationTable()
    for i, row in enumerate(measured_rows):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"measured_rows[{i}]: missing {', '.join(missing)}")
        model = str(row["model"])
        if model not in cache:
            cache[model] = load_profile(model)
        prof = cache[model]
        bw = parse_bandwidth(row["bandwidth"], f"measured_rows[{i}].bandwidth")
        lat = parse_duration(row.get("latency", latency), f"measured_rows[{i}].latency")
        workers = int(row["workers"])
        servers = row.get("servers")
        cluster = ClusterConfig(workers=workers, servers=int(servers) if servers else None, bandwidth=bw,
                                backend=str(row["backend"]), latency=lat,
                                colocated=bool(row.get("colocated", False)),
                                local_size=int(row.get("local_size", 1)))
        strat = make_strategy(str(row["strategy"]))
        if isinstance(strat, ByteScheduler):
            if row.get("partition_bytes"):
                strat.partition_bytes = parse_bytes(row["partition_bytes"], f"measured_rows[{i}].partition_bytes")
            c = row.get("credit_bytes")
            if c:
                strat.credit_bytes = (math.inf if str(c).lower() in ("inf", "none")
                                      else parse_bytes(c, f"measured_rows[{i}].credit_bytes"))
        scale = float(row.get("compute_scale", 1.0))
        measured = float(row["measured_step_s"])
        if not measured > 0:
            raise ValueError(f"measured_rows[{i}].measured_step_s must be > 0, got {row['measured_step_s']!r}")
        res = simulate(prof, cluster, strat, compute_scale=scale, trace=False)
        table.rows.append({
            "model": model, "strategy": strat.name, "backend": cluster.backend, "workers": workers,
            "servers": cluster.servers, "bandwidth_bytes_s": bw, "compute_scale": scale,
            "measured_step_s": measured, "predicted_step_s": res.iteration_s,
            "error": (res.iteration_s - measured) / measured,
        })
    return table
