"""The planner: search strategies, partition sizes and credits with the
simulator and explain the winner.

ByteScheduler tunes partition size and credit online with Bayesian
optimisation because it has no model; with a simulator a small grid is
cheap and deterministic, and the same model tells *why* a setting wins.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from pushpull.profiles import Profile
from pushpull.sim.config import ClusterConfig, SimOptions, format_bytes
from pushpull.sim.events import SimResult, _scaled, simulate
from pushpull.sim.executors import BSP, MGWFBP, WFBP, ByteScheduler, Fusion, Strategy

MB = 1_000_000
# The fluid network charges a message only its latency, so it would always
# like smaller partitions; real per-message CPU costs (not modelled) punish
# them, so the grid starts at 1 MB (ByteScheduler's own tuner starts at 8 MB).
PARTITIONS_MB = (1, 2, 4, 8, 16, 32, 64)
CREDIT_PARTITIONS = (1, 2, 4, 8, 16, 32, math.inf)


def comm_time(profile: Profile, cluster: ClusterConfig) -> float:
    """Time to reduce every gradient once with nothing to overlap: one fused
    buffer (bsp) with zero compute. The denominator of the
    computation-to-communication ratio."""
    return simulate(_scaled(profile, 0.0), cluster, BSP(), trace=False).iteration_s


def grid(cluster: ClusterConfig, partitions_mb=PARTITIONS_MB, credit_partitions=CREDIT_PARTITIONS) -> list[ByteScheduler]:
    out = []
    for p in partitions_mb:
        pb = int(round(p * MB))
        for c in credit_partitions:
            out.append(ByteScheduler(partition_bytes=pb, credit_bytes=math.inf if math.isinf(c) else c * pb))
    return out


def best_bytescheduler(profile: Profile, cluster: ClusterConfig, options: SimOptions | None = None,
                       **grid_kw) -> tuple[SimResult, ByteScheduler]:
    """The best ByteScheduler setting of the grid (ties: the larger partition,
    then the smaller credit: fewer messages, less queueing)."""
    best = None
    for s in grid(cluster, **grid_kw):
        r = _sim(profile, cluster, s, options)
        key = (round(r.iteration_s, 12), -s.partition_bytes, s.credit_bytes)
        if best is None or key < best[0]:
            best = (key, r, s)
    return best[1], best[2]


@dataclass
class Plan:
    cluster: ClusterConfig
    model: str
    best: SimResult
    best_strategy: Strategy
    wfbp: SimResult
    results: list[tuple[Strategy, SimResult]] = field(default_factory=list)
    compute_s: float = 0.0
    comm_s: float = 0.0
    reason: str = ""

    @property
    def gain(self) -> float:
        """Predicted speedup of the recommendation over WFBP."""
        return self.wfbp.iteration_s / self.best.iteration_s

    @property
    def ratio(self) -> float:
        """comm/compute."""
        return self.comm_s / self.compute_s if self.compute_s > 0 else math.inf


def _sim(profile: Profile, cluster: ClusterConfig, s: Strategy, options: SimOptions | None) -> SimResult:
    if options is None:
        return simulate(profile, cluster, s, trace=False)
    return simulate(profile, cluster, s, options=options)


def plan(profile: Profile, cluster: ClusterConfig, options: SimOptions | None = None,
         fusion: Fusion | None = None, **grid_kw) -> Plan:
    """Recommend a strategy (and partition size and credit) for ``cluster``.

    ``options`` (e.g. ``layerwise_update=False``) and ``fusion`` (the job's own
    threshold and cycle) let a running job plan for what it really runs
    (:mod:`pushpull.torch.executors.auto`)."""
    results: list[tuple[Strategy, SimResult]] = []
    for s in (BSP(), WFBP(), fusion or Fusion(), MGWFBP()):
        results.append((s, _sim(profile, cluster, s, options)))
    bs_res, bs = best_bytescheduler(profile, cluster, options, **grid_kw)
    results.append((bs, bs_res))
    wfbp = results[1][1]
    # prefer simpler strategies on a tie (within 0.5 %)
    order = {"wfbp": 0, "fusion": 1, "mgwfbp": 2, "bytescheduler": 3, "bsp": 4}
    fastest = min(r.iteration_s for _, r in results)
    cands = [(s, r) for s, r in results if r.iteration_s <= fastest * 1.005]
    s_best, r_best = min(cands, key=lambda sr: (order[sr[0].name], sr[1].iteration_s))
    p = Plan(cluster, profile.model, r_best, s_best, wfbp, results, compute_s=profile.compute_s,
             comm_s=comm_time(profile, cluster))
    p.reason = explain(p, profile)
    return p


def explain(p: Plan, profile: Profile) -> str:
    """One line on why the winner wins, from the model's own numbers."""
    ratio = p.ratio
    c = p.cluster
    notes = []
    if c.backend == "ps" and c.servers < c.workers:
        notes.append(f"the {c.servers} servers carry n/k = {c.workers / c.servers:g}x a worker's bytes; "
                     f"up to {c.workers} servers would cut communication")
    gain = p.gain
    name = p.best_strategy.name
    if gain < 1.03:
        if ratio < 0.5:
            head = (f"compute-bound: comm/compute = {ratio:.2g}; wfbp already hides communication "
                    f"behind the backward pass (gain < 3 %)")
        elif ratio > 4:
            head = (f"network-bound: comm/compute = {ratio:.2g}; no ordering can hide more than the compute "
                    f"time, so scheduling gains little; compress or add bandwidth/servers")
        else:
            head = f"balanced: comm/compute = {ratio:.2g}, but wfbp's order already overlaps well (gain < 3 %)"
        return "; ".join([head] + notes)
    if name == "bytescheduler":
        kind = ("communication-bound" if ratio >= 1.2 else
                "communication comparable to compute" if ratio >= 0.5 else "mostly compute-bound")
        head = (f"{kind}: comm/compute = {ratio:.2g}; partitioning lets late layers overlap "
                f"the next forward and priority sends the input layers first")
    elif name in ("mgwfbp", "fusion"):
        sizes = [t.nbytes for t in profile.tensors() if t.nbytes > 0]
        med = statistics.median(sizes) if sizes else 0
        head = (f"latency-bound: {len(sizes)} tensors, median {format_bytes(med)}; merging them saves "
                f"per-message latency ({c.latency * 1e6:g} us each)")
    else:
        head = f"comm/compute = {ratio:.2g}"
    return "; ".join([head] + notes)
