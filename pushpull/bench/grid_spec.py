"""The grid's specification: a ``pushpull bench grid`` config (JSON) read and expanded into jobs.

Why a module of its own: the runner (:mod:`pushpull.bench.grid`), the report (:mod:`pushpull.bench.report`),
the benchmarks that replay a grid cell (``benchmarks/ps_*.py``) and the tests need the config's meaning --
strategy variants, the scaled model, the scaled key sizes, a cell's identity -- without launching anything.
The keys themselves are documented in :mod:`pushpull.bench.grid` (``pushpull bench grid --help``).
"""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from pushpull import policy, units
from pushpull.config import DEFAULTS, default_partition_bytes
from pushpull.policy import bytescheduler as bs_policy

# the runtime's strategies (pushpull.policy: a strategy added there is a grid strategy too), plus "ddp":
# PyTorch's own DistributedDataParallel as the reference
BASE_STRATEGIES = tuple(n for n in policy.names() if policy.get(n).runtime != "-") + ("ddp",)
AUTO_WARMUP = 10  # auto: 3 measuring + 3 confirming + 3 on a fallback + 1 with the final pick (defaults)
BS_DEFAULTS = bs_policy.DEFAULTS
WHOLE = 1 << 40  # a partition size no tensor reaches
KEY_FIELDS = ("model", "strategy", "backend", "workers", "servers", "placement", "bandwidth", "delay",
              "ratio", "grad_mb", "ps_partition_bytes", "repeat", "congestion", "auth", "local_size", "local_reduce")
KEY_DEFAULTS = {"local_size": 1, "local_reduce": "auto"}  # what rows from before these fields ran with


def load_config(path: str | Path) -> dict:
    text = Path(path).read_text()
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    cfg = json.loads(text)
    cfg.setdefault("name", Path(path).stem)
    return cfg


def restrict(cfg: dict, backends: str | None = None, models: str | None = None,
             strategies: str | None = None) -> dict:
    """``cfg`` with only the named backends, models and strategies (comma-separated; None keeps all). A
    name the config does not have is an error naming it, so a typo never runs nothing."""
    out = dict(cfg)
    for key, want in (("backends", backends), ("models", models), ("strategies", strategies)):
        if not want:
            continue
        have = _list(cfg.get(key), ["ps"] if key == "backends" else [])
        names = [w.strip() for w in want.split(",") if w.strip()]
        bad = [w for w in names if w not in have]
        if bad:
            raise ValueError(f"--{key}: {bad} not in the config's {key} {have}")
        out[key] = [h for h in have if h in names]
    return out


def _list(v, default):
    if v is None:
        return list(default)
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _bytes(v):
    if v is None:
        return None
    if isinstance(v, str) and v.lower() == "whole":
        return WHOLE
    if isinstance(v, str) and v.lower() in ("inf", "none", "unlimited"):
        return WHOLE
    return units.size_bytes(v, "partition_bytes/credit_bytes")


def strategy_spec(name: str, cfg: dict) -> dict:
    """{'name', 'base', 'layerwise', 'partition_bytes', 'credit_bytes', 'compression', 'backends'}."""
    var = (cfg.get("variants") or {}).get(name)
    if var is not None:
        base = var.get("base", "bytescheduler")
        spec = {"name": name, "base": base.split("+")[0], "layerwise": base.endswith("+lw") or bool(var.get("layerwise")),
                "partition_bytes": _bytes(var.get("partition_bytes")), "credit_bytes": _bytes(var.get("credit_bytes")),
                "compression": var.get("compression"), "backends": var.get("backends")}
    else:
        base = name.split("+")[0]
        spec = {"name": name, "base": base, "layerwise": name.endswith("+lw"), "partition_bytes": None,
                "credit_bytes": None, "compression": None, "backends": None}
    bases = tuple(n for n in policy.names() if policy.get(n).runtime != "-") + ("ddp",)  # read now: new files
    if spec["base"] not in bases:
        raise ValueError(f"strategy {name!r}: unknown base {spec['base']!r} (choose from {bases} "
                         f"or define it under 'variants')")
    if spec["compression"] and spec["backends"] is None:
        spec["backends"] = ["ps"]
    if spec["base"] == "ddp":  # PyTorch's own DistributedDataParallel over the same gloo process group
        spec["backends"] = ["allreduce"]
        spec["bucket_mb"] = float(var.get("bucket_mb", 25)) if var else 25.0
    if spec["base"] == "auto":  # its exploration must end before the timed steps
        spec["warmup"] = int(var.get("warmup", AUTO_WARMUP)) if var else AUTO_WARMUP
        spec["options"] = dict(var.get("options") or {}) if var else {}
    return spec


def scaled_profile(model: str, grad_mb: float):
    """(profile, size_scale, grad_bytes) exactly as EmulatedModel builds the tensors."""
    from pushpull.profiles import load_profile

    prof = load_profile(model)
    size_scale = min(1.0, grad_mb * 1e6 / prof.nbytes)
    numel = sum(max(1, int(round(t.numel * size_scale))) for t in prof.tensors())
    return prof, size_scale, numel * 4


def compute_scale_for(prof, grad_bytes: float, rate_Bps: float, ratio: float) -> float:
    """The factor on the profile's compute times that makes forward+backward last ``ratio`` x (gradient bytes /
    link rate): the cell's computation/communication ratio against moving the gradients once over one link."""
    return float(ratio) * (grad_bytes / rate_Bps) / prof.compute_s


def scaled_ps_partition_bytes(size_scale: float, servers: int = 1) -> int:
    """The out-of-the-box key size of a model shrunk by ``size_scale`` on ``servers`` servers: BytePS's
    4,096,000 scaled with the model's tensors, at least 64 KiB (so a tiny model is not cut into thousands of
    messages), times the share :func:`pushpull.config.default_partition_bytes` keeps at that many servers
    (1 up to 4 servers, 4/k beyond)."""
    share = default_partition_bytes(servers) / DEFAULTS.partition_bytes
    return max(1024, int(max(65536, int(DEFAULTS.partition_bytes * size_scale)) * share))


def _scaled_scheduling(run: dict, backend: str, size_scale: float) -> dict:
    """A strategy that schedules (partition + credit, pushpull.policy) gets its defaults scaled with the
    model's tensors, unless the variant set them; the others keep the backend's."""
    pol = policy.get(run["base"]) if run["base"] in policy.names() else None
    if pol is None or not pol.schedules:
        return {"partition_bytes": run["partition_bytes"], "credit_bytes": run["credit_bytes"]}
    p_def, c_def = pol.scheduling(backend)
    return {"partition_bytes": run["partition_bytes"] or max(4096, int(p_def * size_scale)),
            "credit_bytes": run["credit_bytes"] or max(4096, int(c_def * size_scale))}


def expand(cfg: dict) -> list[dict]:
    """The grid's jobs, each with its cells' strategies."""
    jobs = []
    grad_mb = float(cfg.get("grad_mb", 8))
    specs = [strategy_spec(s, cfg) for s in _list(cfg.get("strategies"), ["wfbp", "bytescheduler"])]
    for model, backend, n, srv, placement, bw, ratio, auth, ls, lr, psp, rep in itertools.product(
            _list(cfg.get("models"), ["resnet50"]), _list(cfg.get("backends"), [DEFAULTS.backend]),
            _list(cfg.get("workers"), [4]), _list(cfg.get("servers"), ["workers"]),
            _list(cfg.get("placements"), ["colocated"]),
            _list(cfg.get("bandwidths"), ["200mbit"]), _list(cfg.get("ratios"), [1.0]),
            _list(cfg.get("auth"), [DEFAULTS.auth]), _list(cfg.get("local_size"), [1]),
            _list(cfg.get("local_reduce"), [DEFAULTS.local_reduce]), _list(cfg.get("ps_partition_bytes"), [None]),
            range(int(cfg.get("repeats", 1)))):
        k = n if srv == "workers" else int(srv)
        ls = int(ls)
        lr = {True: "on", False: "off"}.get(lr, str(lr).lower())
        if lr not in ("auto", "on", "off"):
            raise ValueError(f"local_reduce must be auto, on or off, got {lr!r}")
        if any(all(str(dict(model=model, backend=backend, workers=n, servers=k, placement=placement, bandwidth=bw,
                                ratio=ratio, local_size=ls, local_reduce=lr, auth=auth).get(key)) == str(v)
                   for key, v in ex.items())
               for ex in cfg.get("exclude", [])):
            continue
        runs = [s for s in specs if s["backends"] is None or backend in s["backends"]]
        if not runs:
            continue
        prof, size_scale, grad_bytes = scaled_profile(model, grad_mb)
        bw_bytes = units.rate_bytes(bw, "bandwidths", allow_inf=True)
        compute_scale = compute_scale_for(prof, grad_bytes, bw_bytes, ratio)
        runs = [dict(r, **_scaled_scheduling(r, backend, size_scale)) for r in runs]
        hosts = n if placement == "colocated" else n + k
        jobs.append({"model": model, "backend": backend, "workers": n, "servers": k, "placement": placement,
                     "bandwidth": bw, "bandwidth_bytes_s": bw_bytes, "delay": cfg.get("delay"),
                     "congestion": cfg.get("congestion", "cubic"), "auth": auth, "local_size": ls,
                     "local_reduce": lr,
                     "ratio": float(ratio), "grad_mb": grad_mb, "repeat": rep, "hosts": hosts,
                     "size_scale": size_scale, "grad_bytes": grad_bytes, "compute_scale": compute_scale,
                     "batch_size": prof.batch_size, "runs": runs,
                     # PS keys: the default key size at k servers x the size scale (BYTEPS_PARTITION_BYTES)
                     "ps_partition_bytes": (scaled_ps_partition_bytes(size_scale, k) if psp in (None, "default")
                                            else default_partition_bytes(k) if psp == "engine"
                                            else units.size_bytes(psp, "ps_partition_bytes")),
                     # "engine": BYTEPS_PARTITION_BYTES stays unset, so the optimizer may fit the key to the
                     # model (Engine.fit_default_keys); the row records the key the engine ran with
                     "ps_partition_engine": psp == "engine"})
    return jobs


def cell_key(row: dict) -> tuple:
    """A cell's identity as the config asked for it: a row whose hosts ran another congestion control than
    the one asked (the machine refused it) keeps the asked one in ``congestion_asked``, so resuming skips it."""
    row = dict(row, congestion=row["congestion_asked"]) if "congestion_asked" in row else row
    return tuple(str(row.get(f, KEY_DEFAULTS.get(f))) for f in KEY_FIELDS)

