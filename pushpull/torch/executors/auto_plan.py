"""What the ``auto`` strategy asks the simulator, from what the job measured
(no torch here, so it is tested and reused without a cluster).

* :func:`measured_profile`: a Profile from rank 0's gradient-ready times,
  sizes and forward gap: one layer per gradient, in forward order.
* :func:`fit_cluster`: a ClusterConfig per backend whose per-message cost,
  latency and bandwidth make the simulator reproduce the job's own probes (a
  stream of small reductions, one tiny one, one large one), the calibration
  ``benchmarks/validate_sim.py`` validated (2.9 % median error). Fitting the
  bandwidth to the probe absorbs what the model does not know (TCP goodput,
  CPU per byte, where the servers are), using only what the job measured.
* :func:`rank_candidates`: every (backend, strategy) with its predicted step,
  ByteScheduler at its best partition and credit; :func:`choose` picks the
  fastest and the runner-up (the best that differs in backend or strategy).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pushpull.profiles import DTYPE_BYTES, LayerProfile, Profile, TensorSpec

if TYPE_CHECKING:  # the simulator is imported where it is used: importing the runtime's executors does not load it
    from pushpull.sim.config import ClusterConfig, CpuCosts

BACKENDS = ("ps", "allreduce")
STRATEGIES = ("wfbp", "fusion", "mgwfbp", "bytescheduler", "bsp")  # simplest first: the tie order
UNLIMITED = 1 << 40  # a credit that never binds (the live engine has no 'infinite')
PARTITION_FRACTIONS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)
MIN_PARTITION = 65536


def measured_profile(names: list[str], ready_s: list[float], nbytes: list[int], forward_s: float,
                     dtypes: list[str] | None = None) -> Profile:
    """Gradients given in ready order (output side first), ready times counted from the first one.

    Layer ``L-1-i`` owns gradient ``i``; its backward is the gap since the previous gradient (the first
    one's is inside the measured forward gap, which also holds the optimizer and zero_grad). The forward
    is spread over the layers like the backward (a layer's forward costs about half its backward)."""
    L = len(names)
    if not (L == len(ready_s) == len(nbytes)):
        raise ValueError(f"measured_profile: {L} names, {len(ready_s)} ready times, {len(nbytes)} sizes")
    bwd = [0.0] * L
    for i in range(1, L):
        bwd[L - 1 - i] = max(0.0, ready_s[i] - ready_s[i - 1])
    total = sum(bwd)
    fwd = [forward_s * (b / total if total > 0 else 1 / L) for b in bwd]
    layers = []
    for f in range(L):
        i = L - 1 - f
        dt = (dtypes[i] if dtypes else "float32")
        if dt not in DTYPE_BYTES:
            dt = "uint8"
        numel = max(1, nbytes[i] // DTYPE_BYTES[dt])
        layers.append(LayerProfile(names[i], fwd[f], bwd[f], [TensorSpec(names[i], numel, dt)]))
    return Profile(model="measured", layers=layers, batch_size=1, device="measured", source="measured")


def _one_buffer_s(cluster: ClusterConfig, nbytes: int) -> float:
    from pushpull.sim.events import simulate

    prof = Profile(model="probe", layers=[LayerProfile("all", 1e-9, 1e-9, [TensorSpec("all", max(1, nbytes), "uint8")])])
    return simulate(prof, cluster, "bsp", layerwise_update=False, trace=False).iteration_s


def host_cpu(path: str | None, shared_cores: float | None = None, auth: str = "auto",
             data_lane: bool = False) -> CpuCosts | None:
    """The CPU cost per byte of PUSHPULL_HOST_PROBE's file (None: unset, or a file without the figures).
    ``auth`` is PUSHPULL_AUTH: ``auto`` and ``curve`` encrypt the PS between machines (CURVE; AES-GCM on the
    data lanes with PUSHPULL_DATA_LANE=1)."""
    from pushpull.sim.config import CpuCosts, read_probe

    if not path:
        return None
    row = read_probe(path)
    enc = ("aesgcm" if data_lane else "curve") if auth in ("auto", "curve") else "none"
    return CpuCosts.from_probe(row, encryption=enc, shared_cores=shared_cores, data_lane=data_lane)


def fit_cluster(backend: str, workers: int, servers: int, probe_bytes: int, t_probe: float, t_small: float,
                t_stream: float, colocated: bool = False,
                ps_partition_bytes: int | None = None, cpu: CpuCosts | None = None) -> ClusterConfig:
    """A cluster on which the simulator times the three probes as they were measured.

    ``message_s`` and the latency are :func:`pushpull.sim.config.per_call_costs` of the two small probes (PS:
    the stream's time per reduction, and what one tiny reduction takes beyond it over a push and a pull;
    all-reduce, whose backend fuses the stream: half of one tiny reduction is rank 0's order message, half
    one collective's 2(n-1) latencies); the bandwidth is found by bisection so that one reduction of
    ``probe_bytes`` (order message included) takes ``t_probe``.

    ``cpu`` (PUSHPULL_HOST_PROBE): the CPU cost per byte is part of the cluster the bandwidth is fitted on,
    so the probe's time is split between the CPU the model already charges and the link. The probe is one
    reduction alone; in a step every process moves bytes at once, which is where the charge matters (on
    shared cores the probe's processes mostly had the cores to themselves)."""
    from pushpull.sim.config import ClusterConfig, per_call_costs

    lat, msg = per_call_costs(backend, workers, max(0.0, t_small), max(0.0, t_stream))
    colocated = bool(colocated and servers <= workers)

    def cl(bw: float) -> ClusterConfig:
        return ClusterConfig(workers=workers, servers=servers, bandwidth=bw, backend=backend, latency=lat,
                             colocated=colocated, message_s=msg, cpu=cpu,
                             ps_partition_bytes=None if ps_partition_bytes is None else int(ps_partition_bytes))

    lo, hi = 1e4, 1e11   # bytes/s (80 kbit/s .. 800 Gbit/s; the fluid model hangs near 1e13)
    if _one_buffer_s(cl(hi), probe_bytes) >= t_probe:
        return cl(hi)    # the probe is all per-message cost: bandwidth does not matter
    if _one_buffer_s(cl(lo), probe_bytes) <= t_probe:
        return cl(lo)
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if _one_buffer_s(cl(mid), probe_bytes) > t_probe:
            lo = mid
        else:
            hi = mid
    return cl(math.sqrt(lo * hi))


def partitions(model_bytes: int) -> list[int]:
    """ByteScheduler partition sizes to try: fractions of the model, in KiB, at least 64 KiB."""
    return sorted({max(MIN_PARTITION, int(model_bytes * f) // 1024 * 1024) for f in PARTITION_FRACTIONS})


def rank_candidates(profile: Profile, clusters: dict[str, ClusterConfig], layerwise: bool,
                    fusion_threshold_bytes: int, fusion_cycle_s: float) -> list[dict]:
    """Every (backend, strategy) with its predicted step time, fastest first (ties within 0.5 %: the
    order of ``clusters``, then the simpler strategy)."""
    from pushpull.sim.config import SimOptions
    from pushpull.sim.executors import ByteScheduler, Fusion
    from pushpull.sim.plan import plan

    opts = SimOptions(layerwise_update=layerwise, trace=False)
    parts = [p / 1e6 for p in partitions(profile.nbytes)]
    out = []
    for bi, (backend, cluster) in enumerate(clusters.items()):
        p = plan(profile, cluster, options=opts, fusion=Fusion(threshold_bytes=fusion_threshold_bytes,
                                                                cycle_s=fusion_cycle_s), partitions_mb=parts)
        for s, r in p.results:
            c = {"backend": backend, "strategy": s.name, "predicted_s": r.iteration_s, "partition_bytes": 0,
                 "credit_bytes": 0, "order": (bi, STRATEGIES.index(s.name))}
            if isinstance(s, ByteScheduler):
                c["partition_bytes"] = int(s.partition_bytes)
                c["credit_bytes"] = UNLIMITED if math.isinf(s.credit_bytes) else int(s.credit_bytes)
            if s.name == "mgwfbp":
                c["alpha"], c["beta"] = cluster.alpha_beta()
            out.append(c)
    fastest = min(c["predicted_s"] for c in out)

    def key(c):
        tied = c["predicted_s"] <= fastest * 1.005
        return (not tied, 0.0 if tied else c["predicted_s"], c["order"])
    out.sort(key=key)
    for c in out:
        del c["order"]
    return out


def allowed(cands: list[dict], only: list[str] | None) -> list[dict]:
    """Keep the candidates ``only`` names: ``"fusion"``, ``"ps:wfbp"``, ``"allreduce:*"``."""
    if not only:
        return cands

    def ok(c):
        for spec in only:
            b, _, s = spec.rpartition(":")
            if (not b or b in ("*", c["backend"])) and s in ("*", c["strategy"]):
                return True
        return False
    return [c for c in cands if ok(c)]


def choose(cands: list[dict]) -> tuple[dict, dict | None]:
    """The fastest candidate and the runner-up: the best one on another backend where there is one (the
    confirmation then measures both backends on the live job: the fitted model compares strategies over one
    backend well, but two backends through CPU costs and link fits that can each be off by more than their
    difference), else the best that differs in strategy."""
    if not cands:
        raise ValueError("auto: no candidate strategy left to choose from")
    best = cands[0]
    other = [c for c in cands[1:] if c["backend"] != best["backend"]]
    if other:
        return best, other[0]
    for c in cands[1:]:
        if c["strategy"] != best["strategy"]:
            return best, c
    return best, None
