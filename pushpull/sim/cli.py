"""``pushpull sim`` and ``pushpull plan``.

``sim`` prints predicted iteration time, throughput and speedup over WFBP
for a list of strategies (optionally over a sweep of bandwidths or
computation-to-communication ratios, with a plot); ``plan`` searches
strategies, partition sizes and credits and recommends one, with the reason.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from pushpull.cli import help_text
from pushpull.config import DEFAULTS, LANE_MIN_PARTITION_BYTES, data_lane_wanted
from pushpull.policy.bytescheduler import DEFAULTS as BS_DEFAULTS
from pushpull.profiles import Profile, ProfileError, load_profile
from pushpull.sim.config import (ClusterConfig, Compression, CpuCosts, format_bandwidth, format_bytes,
                                 parse_bandwidth, parse_bytes, parse_duration, read_probe)
from pushpull.sim.events import SimResult, _scaled, simulate
from pushpull.sim.executors import STRATEGIES, ByteScheduler, Fusion, Strategy, make_strategy

SWEEP_KEYS = ("bandwidth", "ratio", "workers", "servers", "compute_scale")


class CliError(Exception):
    """A bad argument; the message starts with the argument's name."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="shipped profile name (e.g. resnet50) or a profile JSON path")
    p.add_argument("--workers", required=True, help="worker machines (network endpoints)")
    p.add_argument("--servers", help="PS servers (default: as many as workers)")
    p.add_argument("--bandwidth", required=True, help="per-host NIC bandwidth, e.g. 10gbit, 100mbit, 25Gbps")
    p.add_argument("--latency", default="50us", help="per-message latency (default 50us)")
    p.add_argument("--message-s", default="0us",
                   help="per-message CPU time on a worker, overlapping the wire (default 0us; "
                        "`pushpull bench probe` measures it and --latency on a machine before a run)")
    p.add_argument("--order-message",
                   help="all-reduce: rank 0's order message per batch, after which the batch's (fused) collectives "
                        "go (default: 2(n-1) x --latency, a tiny collective's; `pushpull bench probe` measures it)")
    p.add_argument("--probe",
                   help="a `pushpull bench probe --out` file: charge its CPU cost per byte to every process "
                        "(pushpull.sim.config.CpuCosts; a file without the cpu_* figures charges nothing)")
    p.add_argument("--encryption", default="auto", choices=("auto", "curve", "aesgcm", "none"),
                   help="with --probe: what the PS pays per byte to encrypt (auto = PUSHPULL_AUTH=auto between "
                        "machines: ZeroMQ CURVE, AES-128-GCM with --data-lane; none: plain; the ring is never "
                        "encrypted)")
    p.add_argument("--data-lane", nargs="?", const="1", default="auto", choices=("auto", "0", "1"),
                   help="with --probe: whether the PS's data path is a plain-socket lane, not ZeroMQ, as "
                        "PUSHPULL_DATA_LANE (default auto: lanes for keys of at least "
                        f"{LANE_MIN_PARTITION_BYTES} bytes; --data-lane alone: 1)")
    p.add_argument("--cores", default="1",
                   help="with --probe: cores each process (worker, server, ring rank) can use (default 1)")
    p.add_argument("--shared-cores",
                   help="with --probe: every process of the job shares this many cores (the emulated cluster on "
                        "one machine: its core count; default: each process has --cores of its own)")
    p.add_argument("--colocated", action="store_true", help="servers share the workers' machines (BytePS layout)")
    p.add_argument("--local-size", default="1", help="devices per worker machine, reduced locally (default 1)")
    p.add_argument("--no-local-reduce", action="store_true",
                   help="each of the --local-size processes pushes every tensor over the machine's NIC "
                        "(PUSHPULL_LOCAL_REDUCE=0; PS backend)")
    p.add_argument("--sum-rate", help="server summation rate, e.g. 5GB/s (default: free)")
    p.add_argument("--ps-partition-bytes",
                   help=f"PS key sharding size (default BYTEPS_PARTITION_BYTES's: {DEFAULTS.partition_bytes} up to "
                        f"4 servers, 4/k of it beyond, pushpull.config.default_partition_bytes)")
    p.add_argument("--compute-scale", default="1", help="multiply profile compute times (GPU k x faster: 1/k)")
    p.add_argument("--no-layerwise", action="store_true", help="next forward waits for every gradient")
    p.add_argument("--compression-ratio", help="gradient compression ratio (payload = bytes/ratio)")
    p.add_argument("--codec-s-per-byte", default="0", help="compress and decompress cost, seconds per byte")
    p.add_argument("--min-compress-bytes", default=str(DEFAULTS.min_compress_bytes),
                   help=f"smaller tensors are not compressed (default {DEFAULTS.min_compress_bytes}, "
                        f"BYTEPS_MIN_COMPRESS_BYTES's)")


def _int(value, arg: str, lo: int = 1) -> int:
    try:
        v = int(str(value))
    except ValueError:
        raise CliError(f"{arg}: expected an integer, got {value!r}") from None
    if v < lo:
        raise CliError(f"{arg}: must be >= {lo}, got {v}")
    return v


def _float(value, arg: str, lo: float = 0.0, strict: bool = False) -> float:
    try:
        v = float(str(value))
    except ValueError:
        raise CliError(f"{arg}: expected a number, got {value!r}") from None
    if math.isnan(v) or v < lo or (strict and v == lo) or math.isinf(v):
        raise CliError(f"{arg}: must be a finite number {'>' if strict else '>='} {lo:g}, got {value!r}")
    return v


def _wrap(fn, value, arg):
    try:
        return fn(value, arg)
    except ValueError as e:
        msg = str(e)
        raise CliError(msg if msg.startswith(arg) else f"{arg}: {msg}") from None


def _load(spec: str) -> Profile:
    try:
        return load_profile(spec)
    except (ProfileError, OSError) as e:
        raise CliError(f"--profile: {e}") from None


def _cluster(a, **over) -> ClusterConfig:
    workers = over.get("workers", None) or _int(a.workers, "--workers")
    servers = over.get("servers", None) or (_int(a.servers, "--servers") if a.servers else None)
    bw = over.get("bandwidth", None) or _wrap(parse_bandwidth, a.bandwidth, "--bandwidth")
    kw = dict(
        workers=workers, servers=servers, bandwidth=bw,
        backend=getattr(a, "backend", "ps") or "ps",
        latency=_wrap(parse_duration, a.latency, "--latency"),
        message_s=_wrap(parse_duration, a.message_s, "--message-s"),
        dispatch_s=_wrap(parse_duration, a.order_message, "--order-message") if a.order_message else None,
        colocated=a.colocated,
        local_size=_int(a.local_size, "--local-size"),
        local_reduce=not a.no_local_reduce,
        sum_rate=_wrap(parse_bandwidth, a.sum_rate, "--sum-rate") if a.sum_rate else None,
        ps_partition_bytes=(_wrap(parse_bytes, a.ps_partition_bytes, "--ps-partition-bytes")
                            if a.ps_partition_bytes else None),
    )
    kw["cpu"] = _cpu(a)
    if kw["ps_partition_bytes"] is not None and kw["ps_partition_bytes"] < 1:
        raise CliError("--ps-partition-bytes: must be >= 1 byte")
    try:
        return ClusterConfig(**kw)
    except ValueError as e:
        first = str(e).split()[0].rstrip(":")
        raise CliError(f"--{first.replace('_', '-')}: {e}") from None


def _cpu(a) -> CpuCosts | None:
    if not getattr(a, "probe", None):
        return None
    try:
        row = read_probe(a.probe)
    except (OSError, ValueError) as e:
        raise CliError(f"--probe: {e}") from None
    if row is None:
        return None
    cores = _float(a.cores, "--cores", strict=True)
    shared = _float(a.shared_cores, "--shared-cores", strict=True) if a.shared_cores else None
    return CpuCosts.from_probe(row, encryption=a.encryption, cores=cores, shared_cores=shared,
                               data_lane=_data_lane(a))


def _data_lane(a) -> bool:
    """--data-lane as PUSHPULL_DATA_LANE decides it for the PS keys simulated (pushpull.config.data_lane_on)."""
    part = (_wrap(parse_bytes, a.ps_partition_bytes, "--ps-partition-bytes") if getattr(a, "ps_partition_bytes", None)
            else DEFAULTS.partition_bytes)
    return data_lane_wanted(getattr(a, "data_lane", "auto"), part)


def _compression(a) -> Compression | None:
    if not a.compression_ratio:
        return None
    cost = _float(a.codec_s_per_byte, "--codec-s-per-byte")
    return Compression(ratio=_float(a.compression_ratio, "--compression-ratio", strict=True),
                       compress_s_per_byte=cost, decompress_s_per_byte=cost,
                       min_compress_bytes=_wrap(parse_bytes, a.min_compress_bytes, "--min-compress-bytes"))


def _strategies(a) -> list[Strategy]:
    names = [s.strip() for s in a.strategy.split(",") if s.strip()]
    if not names:
        raise CliError("--strategy: empty list")
    comp = _compression(a)
    out = []
    for name in names:
        try:
            s = make_strategy(name)
        except ValueError as e:
            raise CliError(f"--strategy: {str(e).split(': ', 1)[-1]}") from None
        if isinstance(s, ByteScheduler):
            if a.partition_bytes:
                s.partition_bytes = _wrap(parse_bytes, a.partition_bytes, "--partition-bytes")
                if s.partition_bytes < 1:
                    raise CliError("--partition-bytes: must be >= 1 byte")
            if a.credit_bytes:
                s.credit_bytes = (math.inf if a.credit_bytes.lower() in ("inf", "none")
                                  else _wrap(parse_bytes, a.credit_bytes, "--credit-bytes"))
                if s.credit_bytes <= 0:
                    raise CliError("--credit-bytes: must be > 0")
        if isinstance(s, Fusion):
            if a.fusion_threshold:
                s.threshold_bytes = _wrap(parse_bytes, a.fusion_threshold, "--fusion-threshold")
            if a.cycle:
                s.cycle_s = _wrap(parse_duration, a.cycle, "--cycle")
        s.compression = comp
        out.append(s)
    return out


def _parse_sweep(spec: str) -> tuple[str, list]:
    if "=" not in spec:
        raise CliError(f"--sweep: expected KEY=V1,V2,... with KEY in {', '.join(SWEEP_KEYS)}, got {spec!r}")
    key, vals = spec.split("=", 1)
    key = key.strip().replace("-", "_")
    if key not in SWEEP_KEYS:
        raise CliError(f"--sweep: unknown key {key!r}; choose from {', '.join(SWEEP_KEYS)}")
    raw = [v.strip() for v in vals.split(",") if v.strip()]
    if not raw:
        raise CliError("--sweep: no values")
    if key == "bandwidth":
        return key, [_wrap(parse_bandwidth, v, "--sweep bandwidth") for v in raw]
    if key in ("workers", "servers"):
        return key, [_int(v, f"--sweep {key}") for v in raw]
    return key, [_float(v, f"--sweep {key}", strict=True) for v in raw]


# ---------------------------------------------------------------------------
# sim
# ---------------------------------------------------------------------------

def _sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pushpull sim", description=help_text(__doc__.split("\n\n")[1].strip()))
    _common(p)
    p.add_argument("--backend", default=DEFAULTS.backend, choices=("ps", "allreduce"))
    p.add_argument("--strategy", default=",".join(STRATEGIES),
                   help=f"comma-separated, from {', '.join(STRATEGIES)} (default: all)")
    p.add_argument("--partition-bytes", help=f"bytescheduler partition size (default {BS_DEFAULTS['ps'][0]} PS, "
                                             f"{BS_DEFAULTS['allreduce'][0]} all-reduce)")
    p.add_argument("--credit-bytes", help=f"bytescheduler credit, or inf (default {BS_DEFAULTS['ps'][1]} PS, "
                                          f"{BS_DEFAULTS['allreduce'][1]} all-reduce)")
    p.add_argument("--fusion-threshold", help="fusion buffer size (default 64MiB)")
    p.add_argument("--cycle", help="fusion cycle time (default 1ms)")
    p.add_argument("--sweep", help="KEY=V1,V2,...: bandwidth=1gbit,10gbit | ratio=0.25,0.5,1,2 (compute/comm) | workers=.. | servers=.. | compute_scale=..")
    p.add_argument("--plot", help="write a plot (PNG) of the sweep, or of the strategies")
    p.add_argument("--trace", help="write a Chrome trace of the (first) point; one file per strategy if several")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    return p


def _run_point(profile: Profile, cluster: ClusterConfig, strategies: list[Strategy], scale: float,
               layerwise: bool, trace: bool) -> list[SimResult]:
    return [simulate(profile, cluster, s, compute_scale=scale, layerwise_update=layerwise, trace=trace)
            for s in strategies]


def _table(results: list[SimResult], title: str, base: SimResult | None = None) -> str:
    """Strategies side by side; speedups are over WFBP (simulated apart if not listed)."""
    base = next((r for r in results if r.strategy == "wfbp"), base)
    w = max([len(r.strategy) for r in results] + [8])
    lines = [title,
             f"  {'strategy':<{w}}  {'iter ms':>10}  {'samples/s':>11}  {'exposed ms':>10}  {'overlap':>7}  "
             f"{'vs wfbp':>7}"]
    for r in results:
        sp = f"{base.iteration_s / r.iteration_s:6.2f}x" if base and r.iteration_s > 0 else "      -"
        lines.append(f"  {r.strategy:<{w}}  {r.iteration_s * 1e3:10.2f}  {r.throughput:11.1f}  "
                     f"{r.exposed_comm_s * 1e3:10.2f}  {r.overlap * 100:6.0f}%  {sp:>7}")
    if base and any(r.strategy.startswith("bytescheduler") and r.iteration_s > 1.1 * base.iteration_s
                    for r in results):
        lines.append("  note: bytescheduler is slower than wfbp here; its partition size and credit need "
                     "tuning for this cluster (try `pushpull plan`)")
    return "\n".join(lines)


def _describe(profile: Profile, cluster: ClusterConfig, scale: float) -> str:
    topo = (f"ps {cluster.workers} workers x {cluster.servers} servers{' colocated' if cluster.colocated else ''}"
            if cluster.backend == "ps" else f"ring all-reduce over {cluster.workers} workers")
    return (f"{profile.model}: {profile.numel / 1e6:.1f}M params in {sum(1 for _ in profile.tensors())} tensors "
            f"({format_bytes(profile.nbytes)}), compute {profile.compute_s * scale * 1e3:.1f} ms/iter; "
            f"{topo}, {format_bandwidth(cluster.bandwidth)}, latency {cluster.latency * 1e6:g} us"
            + (f", {cluster.message_s * 1e6:g} us CPU per message" if cluster.message_s else "")
            + (_describe_cpu(cluster) if cluster.cpu is not None else ""))


def _describe_cpu(cluster: ClusterConfig) -> str:
    c = cluster.cpu
    where = (f"{c.shared_cores:g} cores shared by all processes" if c.shared_cores is not None
             else f"{c.cores:g} core(s) per process")
    if cluster.backend == "ps":
        per = (f"worker {(c.worker_push + c.worker_pull) * 1e9:.2f}, server "
               f"{(c.server_push + c.server_pull) * 1e9:.2f} CPU-s/GB pushed+pulled")
    else:
        per = f"ring rank {c.ring_cpu_s(cluster.workers, 1e9):.2f} CPU-s/GB all-reduced"
    return f"; CPU: {per}, {where}"


def sim_main(argv: list[str] | None = None) -> int:
    parser = _sim_parser()
    a = parser.parse_args(argv)
    try:
        return _sim(a)
    except CliError as e:
        print(f"pushpull sim: error: {e}", file=sys.stderr)
        return 2


def _sim(a) -> int:
    profile = _load(a.profile)
    strategies = _strategies(a)
    scale = _float(a.compute_scale, "--compute-scale")
    layerwise = not a.no_layerwise
    base = _cluster(a)
    if a.sweep:
        key, values = _parse_sweep(a.sweep)
    else:
        key, values = None, [None]
    points = []
    for v in values:
        cluster, s = base, scale
        if key in ("bandwidth", "workers", "servers"):
            over = {key: v}
            if key == "workers" and not a.servers:
                over["servers"] = v
            cluster = _cluster(a, **over)
        elif key == "compute_scale":
            s = v
        elif key == "ratio":
            from pushpull.sim.plan import comm_time
            comm = comm_time(profile, cluster)
            if profile.compute_s <= 0:
                raise CliError("--sweep ratio: the profile has zero compute time")
            s = v * comm / profile.compute_s
        res = _run_point(profile, cluster, strategies, s, layerwise, trace=bool(a.trace) and not points)
        points.append((v, cluster, s, res))
    if a.trace:
        res = points[0][3]
        path = Path(a.trace)
        for r in res:
            out = path if len(res) == 1 else path.with_name(f"{path.stem}.{r.strategy.split('(')[0]}{path.suffix}")
            r.write_trace(out)
    if a.json:
        print(json.dumps([{"sweep": key, "value": v, "compute_scale": s, **r.to_dict()}
                          for v, _, s, res in points for r in res], indent=1))
    else:
        for v, cluster, s, res in points:
            title = _describe(profile, cluster, s)
            if key == "ratio":
                title += f"  [compute/comm = {v:g}]"
            base = None
            if not any(r.strategy == "wfbp" for r in res):
                base = simulate(profile, cluster, "wfbp", compute_scale=s, layerwise_update=layerwise, trace=False)
            print(_table(res, title, base))
            print()
    if a.plot:
        _plot(points, key, Path(a.plot), profile)
        if not a.json:
            print(f"plot written to {a.plot}")
    return 0


def _plot(points, key, path: Path, profile: Profile) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = [r.strategy for r in points[0][3]]
    if key is None:
        res = points[0][3]
        ax.bar(range(len(res)), [r.throughput for r in res])
        ax.set_xticks(range(len(res)), [n.split("(")[0] for n in names], rotation=20)
        ax.set_ylabel("samples/s")
    else:
        xs = [(v * 8 / 1e9 if key == "bandwidth" else v) for v, *_ in points]
        for i, n in enumerate(names):
            ax.plot(xs, [res[i].throughput for *_, res in points], marker="o", label=n.split("(")[0])
        ax.set_xscale("log")
        ax.set_xlabel({"bandwidth": "bandwidth (Gbit/s)", "ratio": "computation / communication"}.get(key, key))
        ax.set_ylabel("samples/s")
        ax.legend()
    ax.set_title(f"pushpull sim: {profile.model}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------

def _plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pushpull plan",
                                description="Recommend strategy, partition size and credit for a cluster.")
    _common(p)
    p.add_argument("--backend", default=DEFAULTS.backend, choices=("ps", "allreduce", "any"),
                   help="ps, allreduce, or any (compare both)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--diloco", action="store_true",
                   help="also plan DiLoCo / local SGD (PS backend): the smallest sync_every H, and the fragments, "
                        "overlap and codec, that keep compute utilisation at --target or above")
    p.add_argument("--target", default="0.9", help="with --diloco: the compute utilisation to keep (default 0.9)")
    return p


def _diloco_plan(prof, cluster, sync_step_s: float, target: float) -> dict:
    """``pushpull plan --diloco``: print the DiLoCo grid's winner beside the synchronous plan."""
    from pushpull.sim.diloco import plan_diloco

    if cluster.backend != "ps":
        raise CliError("--diloco: DiLoCo's outer optimizer runs on the servers; use --backend ps or any")
    dp = plan_diloco(prof, cluster, target=target, sync_step_s=sync_step_s)
    c = dp.best_compute
    out = {"target": target, "sync_utilisation": dp.sync_utilisation, "sync_step_s": sync_step_s}
    if dp.best is None:
        top = max(dp.results, key=lambda r: r.utilisation)
        out.update(setting=None, best_utilisation=top.utilisation, best_setting=top.setting.describe())
        return out
    b = dp.best
    st = b.setting
    out.update(setting={"sync_every": st.sync_every, "fragments": st.fragments, "overlap": st.overlap,
                        "codec": st.codec},
               utilisation=b.utilisation, step_s=b.step_s, exchange_s=b.exchange_s, fewer_bytes=b.fewer_bytes,
               compute_s=c)
    return out


def _print_diloco(d: dict) -> None:
    print()
    print(f"DiLoCo (outer optimizer on the servers), for compute utilisation >= {d['target']:.0%}; "
          f"synchronous: {d['sync_utilisation']:.1%} ({d['sync_step_s'] * 1e3:.1f} ms per step)")
    if d["setting"] is None:
        print(f"  no setting of the grid reaches it: the best is {d['best_setting']} at "
              f"{d['best_utilisation']:.1%}; the link is too slow for this model even once per 500 steps")
        return
    st = d["setting"]
    args = [f"sync_every={st['sync_every']}"]
    if st["fragments"] > 1:
        args.append(f"fragments={st['fragments']}")
    if st["overlap"]:
        args.append(f"overlap={st['overlap']}")
    if st["codec"] != "none":
        args.append(f"compression=bps.Compression.build({st['codec']!r})")
    print(f"  recommendation: bps.DiLoCo(inner, model.named_parameters(), {', '.join(args)})")
    print(f"  predicted: {d['utilisation']:.1%} utilisation, {d['step_s'] * 1e3:.1f} ms per inner step "
          f"(compute {d['compute_s'] * 1e3:.1f} ms), one exchange {d['exchange_s'] * 1e3:.0f} ms, "
          f"{d['fewer_bytes']:.0f}x fewer bytes than synchronous")
    print("  why this one: the smallest H that keeps the target (closest to synchronous training), then no "
          "codec before int8, then the fewest fragments, each with the shortest overlap that hides its exchange")


def plan_main(argv: list[str] | None = None) -> int:
    a = _plan_parser().parse_args(argv)
    try:
        return _plan(a)
    except CliError as e:
        print(f"pushpull plan: error: {e}", file=sys.stderr)
        return 2


def _plan(a) -> int:
    from pushpull.sim.plan import plan

    profile = _load(a.profile)
    scale = _float(a.compute_scale, "--compute-scale")
    prof = _scaled(profile, scale)
    comp = _compression(a)
    backends = ("ps", "allreduce") if a.backend == "any" else (a.backend,)
    plans = []
    for b in backends:
        a.backend = b
        cluster = _cluster(a)
        p = plan(prof, cluster)
        if comp is not None:  # compression is orthogonal: report it on the recommendation
            p.best_strategy.compression = comp
            p.best = simulate(prof, cluster, p.best_strategy, trace=False)
        plans.append(p)
    best = min(plans, key=lambda p: p.best.iteration_s)
    env = plan_env(best)
    diloco = None
    if a.diloco:
        ps = next((p for p in plans if p.cluster.backend == "ps"), None)
        if ps is None:
            raise CliError("--diloco: DiLoCo's outer optimizer runs on the servers; use --backend ps or any")
        diloco = _diloco_plan(prof, ps.cluster, best.best.iteration_s,
                              _float(a.target, "--target", strict=True))
    if a.json:
        print(json.dumps({
            "env": env, **({"diloco": diloco} if diloco is not None else {}),
            "backend": best.cluster.backend, "strategy": best.best_strategy.name,
            "partition_bytes": getattr(best.best_strategy, "partition_bytes", None),
            "credit_bytes": _num(getattr(best.best_strategy, "credit_bytes", None)),
            "iteration_s": best.best.iteration_s, "wfbp_iteration_s": best.wfbp.iteration_s,
            "gain_over_wfbp": best.gain, "comm_over_compute": best.ratio, "reason": best.reason,
            "candidates": [{"backend": p.cluster.backend, "strategy": s.describe(), "iteration_s": r.iteration_s}
                           for p in plans for s, r in p.results],
        }, indent=1))
        return 0
    for p in plans:
        print(_table([r for _, r in p.results], _describe(prof, p.cluster, 1.0)))
        print()
    s = best.best_strategy
    print(f"recommendation: {best.cluster.backend} + {s.name}")
    if isinstance(s, ByteScheduler):
        credit = "inf (no credit)" if math.isinf(s.credit_bytes) else (
            f"{format_bytes(s.credit_bytes)} ({s.credit_bytes / s.partition_bytes:g} partitions)")
        print(f"  partition size: {format_bytes(s.partition_bytes)} ({s.partition_bytes} bytes)")
        print(f"  credit:         {credit}")
    else:
        bs, bs_res = next((st, r) for st, r in best.results if isinstance(st, ByteScheduler))
        credit = "inf" if math.isinf(bs.credit_bytes) else format_bytes(bs.credit_bytes)
        print(f"  (best bytescheduler setting: partition {format_bytes(bs.partition_bytes)}, credit {credit}: "
              f"{best.wfbp.iteration_s / bs_res.iteration_s:.2f}x over wfbp)")
    print(f"  predicted iteration {best.best.iteration_s * 1e3:.2f} ms, {best.best.throughput:.1f} samples/s; "
          f"gain over wfbp {best.gain:.2f}x")
    print(f"  why: {best.reason}")
    print(f"  apply it: {' '.join(f'{k}={v}' for k, v in env.items())}")
    if diloco is not None:
        _print_diloco(diloco)
    return 0


def plan_env(p) -> dict[str, str]:
    """The settings that make a job run the plan's recommendation (docs/configuration.md)."""
    s = p.best_strategy
    env = {"PUSHPULL_BACKEND": p.cluster.backend, "PUSHPULL_STRATEGY": s.name}
    if isinstance(s, ByteScheduler):
        env["PUSHPULL_BYTESCHEDULER_PARTITION_BYTES"] = str(int(s.partition_bytes))
        # the credit setting has no 'unlimited': a credit larger than the model never binds
        credit = s.credit_bytes if not math.isinf(s.credit_bytes) else 1 << 40
        env["PUSHPULL_BYTESCHEDULER_CREDIT_BYTES"] = str(int(credit))
    return env


def _num(v):
    if v is None:
        return None
    return None if math.isinf(v) else v


if __name__ == "__main__":  # pragma: no cover
    sys.exit(sim_main())
