"""DiLoCo and local SGD in the simulator, and the planner's choice of H and fragments.

What an outer round costs: each worker takes H inner steps alone (compute only), then every fragment of the
model is exchanged once per H steps (Streaming DiLoCo: F fragments at staggered steps, H/F apart): the
pseudo-gradient goes up through the codec and the servers answer with the whole new global parameters
(pushpull/server/server.py: an outer key answers uncompressed). The exchange itself is the simulator's: one
synchronous reduction of the fragment's bytes on the PS network (:func:`pushpull.sim.events.simulate`, zero
compute, compressed one way).

How the exchange meets the compute, per round of H steps and F fragments of exchange time X each:

* ``overlap`` = 0: every exchange stalls the workers: wall = H c + F X;
* ``overlap`` = t steps: the answer is merged t steps after the push, so an exchange stalls the workers only
  for what it takes beyond t c: wall = H c + F max(0, X - t c);
* and never less than the link's own time, F X (exchanges queue behind each other when F X > H c).

Utilisation = H c / wall. Bytes on a worker host's link per inner step: (M / r + M) / H, against 2 M for a
synchronous push_pull (M up, M down). Not modelled: TCP's slow start after an idle link (Linux's
``tcp_slow_start_after_idle``, which a round after H idle steps meets: docs/results/diloco_speed.md), and
stragglers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pushpull.outer import fragments
from pushpull.profiles import Profile
from pushpull.sim.config import ClusterConfig, Compression
from pushpull.sim.synthetic import synthetic_profile

H_GRID = (10, 25, 50, 100, 250, 500)
FRAGMENT_GRID = (1, 2, 4, 8)
CODECS = ("none", "int8", "int4")


def codec_ratio(codec: str, numel: int, dtype: str = "float32") -> float:
    """fp32 bytes / wire bytes of ``codec`` on a tensor of ``numel`` elements, measured by the runtime's own
    codec (pushpull/compression) on a sample of at most 65,536 elements: per-block headers included."""
    if codec in ("none", None):
        return 1.0
    import torch

    from pushpull.compression import build

    n = max(1, min(int(numel), 65536))
    x = torch.randn(n, dtype=getattr(torch, dtype))
    payload = build({"compressor": codec}).compress(x)
    return x.numel() * x.element_size() / (payload.buffer.numel() * payload.buffer.element_size())


@dataclass
class DiLoCoSetting:
    sync_every: int = 100     # H: inner steps per outer round (per fragment)
    fragments: int = 1        # F
    overlap: int = 0          # inner steps an exchange may take before its answer is merged
    codec: str = "none"       # the pseudo-gradients' codec on the way up

    def __post_init__(self):
        if self.sync_every < 1 or self.fragments < 1 or self.overlap < 0:
            raise ValueError(f"DiLoCo setting out of range: {self}")
        if self.overlap and self.overlap >= self.sync_every:
            raise ValueError(f"overlap ({self.overlap}) must be shorter than sync_every ({self.sync_every})")

    def describe(self) -> str:
        s = f"H={self.sync_every}"
        if self.fragments > 1:
            s += f", F={self.fragments}"
        if self.overlap:
            s += f", overlap {self.overlap}"
        if self.codec != "none":
            s += f", {self.codec}"
        return s


@dataclass
class DiLoCoResult:
    setting: DiLoCoSetting
    compute_s: float          # one inner step
    exchange_s: float         # one fragment's exchange (push through the codec, whole answer back)
    step_s: float             # wall time per inner step, steady state
    bytes_per_step: float     # on one worker host's link, both directions
    sync_bytes_per_step: float

    @property
    def utilisation(self) -> float:
        return self.compute_s / self.step_s if self.step_s > 0 else 1.0

    @property
    def fewer_bytes(self) -> float:
        return self.sync_bytes_per_step / self.bytes_per_step if self.bytes_per_step > 0 else math.inf


def _fragment_sizes(numels: list[int], count: int) -> list[list[int]]:
    """The runtime's split (pushpull.outer.fragments) on the profile's tensors."""
    return [[numels[i] for i in frag] for frag in fragments(numels, count)]


def exchange_s(numels: list[int], cluster: ClusterConfig, ratio: float, dtype: str = "float32") -> float:
    """One synchronous exchange of these tensors on ``cluster``'s PS network: pushes ``ratio`` times
    smaller than the tensors, answers whole."""
    from pushpull.sim.events import simulate
    from pushpull.sim.executors import BSP

    prof = synthetic_profile([list(numels)], fwd_s=0.0, dtype=dtype)
    comp = Compression(ratio=ratio, answer_ratio=1.0, min_compress_bytes=0) if ratio != 1.0 else None
    return simulate(prof, cluster, BSP(compression=comp), trace=False).iteration_s


def predict(profile: Profile, cluster: ClusterConfig, setting: DiLoCoSetting,
            _exchanges: dict | None = None) -> DiLoCoResult:
    """Steady-state wall time per inner step and bytes per step of ``setting`` (module docstring).
    ``_exchanges``: (fragments, codec) -> (exchange times, codec ratio), which depend on neither H nor the
    overlap; the planner passes one dict for its whole grid, so each is simulated once."""
    if cluster.backend != "ps":
        raise ValueError("DiLoCo runs its outer optimizer on the servers: the cluster's backend must be 'ps'")
    numels = [t.numel for t in profile.tensors() if t.numel > 0]
    if setting.fragments > len(numels):
        raise ValueError(f"fragments ({setting.fragments}) must not exceed the tensors ({len(numels)})")
    cache = {} if _exchanges is None else _exchanges
    key = (setting.fragments, setting.codec)
    if key not in cache:
        ratio = codec_ratio(setting.codec, max(numels))
        cache[key] = ([exchange_s(f, cluster, ratio) for f in _fragment_sizes(numels, setting.fragments)], ratio)
    xs, ratio = cache[key]
    c = profile.compute_s
    h = setting.sync_every
    hidden = setting.overlap * c
    wall = max(h * c + sum(max(0.0, x - hidden) for x in xs), sum(xs))
    model_bytes = sum(t.nbytes for t in profile.tensors())
    per_round = model_bytes / ratio + model_bytes
    return DiLoCoResult(setting, c, max(xs), wall / h, per_round / h, 2.0 * model_bytes)


@dataclass
class DiLoCoPlan:
    best: DiLoCoResult | None
    target: float
    results: list[DiLoCoResult]
    sync_step_s: float        # the best synchronous strategy's iteration (the planner's)

    @property
    def sync_utilisation(self) -> float:
        return self.best_compute / self.sync_step_s if self.sync_step_s > 0 else 1.0

    @property
    def best_compute(self) -> float:
        return self.results[0].compute_s if self.results else 0.0


MAX_OVERLAP = 0.25  # of H: the planner merges no answer staler than a quarter of a round


def overlap_for(x: float, c: float, h: int, f: int) -> int:
    """The fewest inner steps that hide an exchange of ``x`` seconds, within the fragment's slot (H/F - 1
    steps, so that a fragment's exchanges never pile up) and a quarter of H: an answer merged t steps after
    its push misses t steps of this worker's progress (Streaming DiLoCo kept t at 1-5 of H = 100)."""
    need = math.ceil(x / c) if c > 0 else 1
    return max(0, min(need, h // f - 1, int(h * MAX_OVERLAP)))


def plan_diloco(profile: Profile, cluster: ClusterConfig, target: float = 0.9, sync_step_s: float | None = None,
                h_grid=H_GRID, fragment_grid=FRAGMENT_GRID, codecs=CODECS) -> DiLoCoPlan:
    """The setting closest to synchronous training that keeps utilisation >= ``target``: the smallest H
    (fewer inner steps apart is closer to synchronous, DiLoCo's finding), then no codec before int8 before
    int4, then the fewest fragments; for each (H, F, codec) the overlap that hides the exchange (:func:`overlap_for`)."""
    if sync_step_s is None:
        from pushpull.sim.plan import plan

        sync_step_s = plan(profile, cluster).best.iteration_s
    numels = [t.numel for t in profile.tensors() if t.numel > 0]
    results = []
    best = None
    exchanges: dict = {}  # (fragments, codec) -> simulated once for the whole grid
    for h in h_grid:
        for codec in codecs:
            for f in fragment_grid:
                if f > len(numels) or f > h:
                    continue
                probe = predict(profile, cluster, DiLoCoSetting(h, f, 0, codec), exchanges)
                overlap = overlap_for(probe.exchange_s, probe.compute_s, h, f)
                r = probe if overlap == 0 else predict(profile, cluster, DiLoCoSetting(h, f, overlap, codec),
                                                       exchanges)
                results.append(r)
                if best is None and r.utilisation >= target:
                    best = r
    return DiLoCoPlan(best, target, results, sync_step_s)
