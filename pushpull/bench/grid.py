"""``pushpull bench grid CONFIG``: a benchmark grid on the emulated cluster.

CONFIG is a JSON file (``benchmarks/configs/*.json``; ``//`` line comments are
allowed). The grid is the cross product of

    models x strategies x backends x workers x placements x bandwidths x ratios x repeats

and every cell is one (strategy, setting) measured on the emulated cluster
(:mod:`pushpull.emulate`): one host per worker, servers colocated with the
workers as BytePS recommends (``"placement": "colocated"``) or on hosts of
their own (``"separate"``), every link shaped to the cell's bandwidth.

Keys (defaults in brackets):

* ``name`` [file stem]: results go to ``docs/results/<name>.jsonl`` (``--out``).
* ``models``: shipped profile names or profile files; compute is emulated
  (per-layer sleeps, :mod:`pushpull.bench.emulated_model`), gradients have the
  profile's tensor sizes scaled down to ``grad_mb`` [8] MB in all.
* ``strategies``: any strategy of :mod:`pushpull.policy` (``bsp``, ``wfbp``, ``fusion``, ``mgwfbp``, ``bytescheduler``,
  ``auto`` (:mod:`pushpull.torch.strategies.auto`: picks backend and strategy itself, starting over the
  job's backend; it gets ``AUTO_WARMUP`` [10] untimed warm-up steps, or its variant's ``warmup``, so that
  its measuring, choice, confirmation and fallback all happen before the timed steps; a variant's
  ``options`` go to it, e.g. ``{"candidates": ["ps:*"]}``; rows carry its ``auto_decision``),
  ``NAME+lw`` (layer-wise updates), or a name defined in ``variants``:
  ``{"schedule_only": {"base": "bytescheduler", "partition_bytes": "whole", "credit_bytes": 4e6},
  "fp16": {"base": "wfbp", "compression": "fp16", "backends": ["ps"]}}``.
  ``ddp`` is PyTorch's ``DistributedDataParallel`` itself (gloo, ``bucket_mb``
  [25, its default] per bucket, not scaled with the model) on the all-reduce
  backend's process group: the peer most users would otherwise pick.
  ``partition_bytes``/``credit_bytes`` are bytes of the *scaled* model
  (``"whole"`` = larger than any tensor, ``"inf"`` = unlimited credit); by
  default bytescheduler gets ByteScheduler's defaults (PS 4 MB / 16 MB,
  all-reduce 32 MB / 64 MB) times the size scale, so partitions keep their
  size relative to the tensors. A variant's ``backends`` restricts where it runs
  (compression only exists over PS).
* ``backends`` [["ps"]]: ``ps`` and/or ``allreduce`` (gloo).
* ``workers`` [[4]]: worker hosts (machines); ``local_size`` [[1]]: worker processes on each
  (``BYTEPS_LOCAL_SIZE``; throughput counts all of them); ``local_reduce`` [["auto"]]:
  ``PUSHPULL_LOCAL_REDUCE`` of the jobs (``on``: a host's processes reduce through shared memory first
  and each pushes 1/local_size of every tensor; ``off``: each pushes everything); rows say whether it
  was in force (``local_reduce_active``) and every worker host's measured link bytes per step
  (``link_bytes``: its interface's counters, read around each strategy's timed steps);
  ``servers`` ["workers" = k = n, or a number, or a list of them]; ``placements`` [["colocated"]].
* ``bandwidths`` [["200mbit"]]: link rate per host and direction; ``delay``
  [none]: one-way latency (``"1ms"``); ``congestion`` ["cubic"]: every
  emulated host's TCP congestion control (``"inherit"`` = this machine's); ``auth``
  [["auto"]]: PUSHPULL_AUTH of the jobs (``auto`` = CURVE between the hosts).
* ``ratios`` [[1.0]]: computation/communication ratio: forward+backward time
  = ratio x (gradient bytes / link rate), i.e. against the ideal time of
  moving the gradients once over one link. The resulting compute scale is
  recorded in every row, so the simulator can replay the same cell.
* ``tries`` [3]: interleaved rounds of ``steps`` [4] timed steps per
  strategy within one launch (first round after ``warmup`` [4] untimed steps);
  each round's median is one try (mean +- std in the report).
* ``repeats`` [1]: separate launches of each job.
* ``ps_partition_bytes`` [4,096,000 x size scale, at least 64 KiB, x 4/k
  beyond k = 4 servers as pushpull.config.default_partition_bytes]: the PS
  engine's key size (``BYTEPS_PARTITION_BYTES``); keys are spread over the
  servers, and every key is one push and one pull message. A list makes it a
  grid axis (``"default"`` or ``null`` in it = the default). ``"engine"``: the
  engine's own default at k servers, unscaled (what a job of ``grad_mb`` MB gets
  with BYTEPS_PARTITION_BYTES unset): where the CPU, not a link, is the limit, a
  message's fixed cost does not shrink with the model, so scaled keys would
  charge a scaled model the per-message CPU of the full-size one 1/scale times.
* ``timeout`` [600]: seconds per launch.
* ``exclude`` [[]]: partial cells to leave out, e.g.
  ``[{"backend": "allreduce", "placement": "separate"}]``.

A *job* is one launch: all strategies of one (model, backend, workers,
placement, bandwidth, ratio, repeat) take turns in the same processes. Jobs
sharing a cluster shape (hosts, bandwidth, delay) run on one cluster, set up
once. Resumable: cells already in the results file are skipped. Each cell
appends one JSON line with every parameter, the emulation mode
(``namespaces`` or ``loopback``) and the measured step time / throughput, plus the
probes every job runs on its cluster before the timed steps: ``t_comm_s`` (one
reduction of all gradients as one buffer), ``t_small_s`` (one 4 KB reduction),
``t_stream_s`` (per reduction in a stream of 16 small ones) and ``opt_probe``
(:func:`layerwise_probe`: the optimizers' own cost on the training thread with
communication taken out, measured by every worker at once; rank 0's).
``--loopback`` (or ``PUSHPULL_GRID_LOOPBACK=1``) forces the loopback mode.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import socket
import statistics
import sys

from pushpull import policy, units
from pushpull.policy import bytescheduler as bs_policy
from pushpull.cli import help_text
from pushpull.config import DEFAULTS, default_partition_bytes
import tempfile
import time
from pathlib import Path

# the runtime's strategies (pushpull.policy: a strategy added there is a grid strategy too), plus "ddp":
# PyTorch's own DistributedDataParallel as the reference
BASE_STRATEGIES = tuple(n for n in policy.names() if policy.get(n).runtime != "-") + ("ddp",)
AUTO_WARMUP = 10  # auto: 3 measuring + 3 confirming + 3 on a fallback + 1 with the final pick (defaults)
BS_DEFAULTS = bs_policy.DEFAULTS
WHOLE = 1 << 40  # a partition size no tensor reaches
KEY_FIELDS = ("model", "strategy", "backend", "workers", "servers", "placement", "bandwidth", "delay",
              "ratio", "grad_mb", "ps_partition_bytes", "repeat", "congestion", "auth", "local_size", "local_reduce")
KEY_DEFAULTS = {"local_size": 1, "local_reduce": "auto"}  # what rows from before these fields ran with


# ---------------------------------------------------------------- config --

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


def read_rows(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a crash: that cell is simply run again
    return rows


# ---------------------------------------------------------------- worker side --

def _time_reduction(comm, nbytes: int, name: str, reps: int = 3) -> float:
    import torch

    buf = torch.zeros(max(1, nbytes // 4))
    comm.wait(comm.submit(buf, name, 0))  # first use sets up keys: not timed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        comm.wait(comm.submit(buf, name, 0))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_stream(comm, nbytes: int, count: int = 16, reps: int = 3) -> float:
    """Per-message cost in a stream: ``count`` small reductions submitted at once, time / count."""
    import torch

    bufs = [torch.zeros(max(1, nbytes // 4)) for _ in range(count)]

    def once():
        hs = [comm.submit(b, f"grid.stream.{i}", 0) for i, b in enumerate(bufs)]
        for h in hs:
            comm.wait(h)

    once()  # sets up keys: not timed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append((time.perf_counter() - t0) / count)
    return statistics.median(times)


class _ProbeToken:
    __slots__ = ("event", "t_set")

    def __init__(self) -> None:
        import threading

        self.event = threading.Event()
        self.t_set = 0.0


class _ProbeComm:
    """A Comm whose reductions cost nothing: ``poll`` says not back yet (so, as in a communication-bound
    run, ScheduledOptimizer applies every update in its layer's forward pre-hook, not in ``step()``) and
    ``wait`` returns at once, or, with ``handoff``, blocks until a helper thread completes the reduction
    (the reply arriving on the I/O thread) and records how long the waiter took to resume."""

    def __init__(self, backend: str, handoff: bool = False):
        self.backend = backend
        self.handoff = handoff
        self.wakes: list[float] = []
        self._q = None
        if handoff:
            import queue
            import threading

            self._q = queue.Queue()
            threading.Thread(target=self._completer, name="probe-completer", daemon=True).start()

    def _completer(self) -> None:
        while True:
            tok = self._q.get()
            if tok is None:
                return
            time.sleep(2e-4)                 # let the waiter block first
            tok.t_set = time.perf_counter()
            tok.event.set()

    def close(self) -> None:
        if self._q is not None:
            self._q.put(None)

    def submit(self, tensor, name, priority, average=True):
        return _ProbeToken()

    def poll(self, token) -> bool:
        return False

    def wait(self, token) -> None:
        if not self.handoff:
            return
        self._q.put(token)
        token.event.wait()
        self.wakes.append(time.perf_counter() - token.t_set)

    def set_scheduling(self, partition_bytes: int, credit_bytes: int) -> None:
        pass

    def default_scheduling(self) -> tuple[int, int]:
        return 0, 0

    def scope(self):
        return id(self)


def layerwise_probe(model: str, size_scale: float = 1.0, base: str = "bytescheduler", backend: str = "ps",
                    iters: int = 20, warmup: int = 3) -> dict:
    """What the optimizer costs the training thread, with communication taken out.

    The emulated model (:mod:`pushpull.bench.emulated_model`) with no compute (no sleeps) and the
    cell's tensors runs ``iters`` steps in this process: with no optimizer (zero_grad, forward,
    backward: the baseline), with ``DistributedOptimizer`` and with ``ScheduledOptimizer`` over the
    same ``base`` strategy and a Comm whose reductions are free (:class:`_ProbeComm`: never back at
    ``step()``, so every layer-wise update is applied in its layer's forward pre-hook, as in a
    communication-bound run), and ScheduledOptimizer again with every reduction completed by a helper
    thread once the training thread blocks on it. Returns seconds, each a median over the steps:

    * ``update_lw_s``: per tensor, ScheduledOptimizer's forward pre-hooks (wait bookkeeping, the
      parameter's own optimizer step), i.e. the forward's time over the baseline's, over the tensors;
    * ``step_lw_s``: per iteration, ScheduledOptimizer's ``step()`` (submits nothing new, applies
      nothing: no reduction is back);
    * ``step_s``: per iteration, DistributedOptimizer's ``step()``: ``wait_all`` over every reduction
      (all back) and one optimizer step over all parameters;
    * ``bwd_lw_s``, ``bwd_s``: per iteration, the backward's time over the baseline's (the gradient
      hooks that submit reductions);
    * ``wake_s``: time from a reduction's completion on another thread to the blocked training thread
      running again (once per layer whose update the forward waits for);
    * ``tensors``, ``layers``, ``iters`` and the baseline's phases.

    One process, no sockets: this machine's CPU cost of the code paths under its current load. The
    grid runs it in every worker at once before a job's timed steps, so under the cell's load.
    """
    import torch

    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.profiles import load_profile
    from pushpull.torch import ops
    from pushpull.torch.optimizer import DistributedOptimizer
    from pushpull.torch.scheduled import ScheduledOptimizer
    from pushpull.torch.strategies import make_strategy

    prof = load_profile(model)
    x = torch.zeros(1)
    real_size = ops.size
    ops.size = lambda: max(2, real_size())   # the optimizers' distributed code paths, in one process
    med = statistics.median
    try:
        def run(kind: str, handoff: bool = False) -> dict:
            m = EmulatedModel(prof, 0.0, size_scale)
            named = [(f"probe.{kind}.{n}", p) for n, p in m.named_parameters()]
            sgd = torch.optim.SGD(m.parameters(), lr=0.0)
            comm = _ProbeComm(backend, handoff)
            opt = sgd
            if kind != "none":
                st = make_strategy(base, comm=comm)
                if kind == "lw":
                    opt = ScheduledOptimizer(m, sgd, named_parameters=named, strategy=st)
                else:
                    opt = DistributedOptimizer(sgd, named_parameters=named, strategy=st, model=m)
            ph: dict[str, list[float]] = {"fwd": [], "bwd": [], "step": []}
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                opt.zero_grad()
                out = m(x)
                t1 = time.perf_counter()
                out.sum().backward()
                t2 = time.perf_counter()
                if kind != "none":
                    opt.step()
                t3 = time.perf_counter()
                if i >= warmup:
                    for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("step", t3 - t2)):
                        ph[k].append(v)
            if kind == "lw":
                opt.synchronize()
                opt.remove_hooks()
            comm.close()
            n = sum(1 for _ in m.parameters())
            out = {k: med(v) for k, v in ph.items()}
            out["n"] = n
            out["wakes"] = comm.wakes[warmup * n:]
            return out

        none, dist, lw = run("none"), run("dist"), run("lw")
        wakes = run("lw", handoff=True)["wakes"]
    finally:
        ops.size = real_size
    n = none["n"]
    return {"model": model, "size_scale": size_scale, "base": base, "backend": backend, "tensors": n,
            "layers": len(prof.layers), "iters": iters,
            "update_lw_s": max(0.0, (lw["fwd"] - none["fwd"]) / n), "step_lw_s": lw["step"], "step_s": dist["step"],
            "bwd_lw_s": max(0.0, lw["bwd"] - none["bwd"]), "bwd_s": max(0.0, dist["bwd"] - none["bwd"]),
            "wake_s": med(wakes) if wakes else None, "base_fwd_s": none["fwd"], "base_bwd_s": none["bwd"],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": socket.gethostname(), "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg())}


def link_counters(iface: str | None, pid: int | str = "self") -> tuple[int, int] | None:
    """(received, sent) bytes of this host's interface ``iface``, from the kernel's own counters
    (/proc/net/dev belongs to the reader's network namespace: the emulated host's; with ``pid``, that
    process's namespace, e.g. a server's on an emulated host of its own)."""
    if not iface:
        return None
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == iface:
                    fields = rest.split()
                    return int(fields[0]), int(fields[8])
    except OSError:
        return None


def link_bytes(iface: str) -> tuple[int, int]:
    """:func:`link_counters` of an interface that must exist (a benchmark's own host link): (rx, tx)."""
    got = link_counters(iface)
    if got is None:
        raise RuntimeError(f"interface {iface} not in /proc/net/dev")
    return got
    return None


def child_main(spec: dict, out: str) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.profiles import load_profile
    from pushpull.torch.strategies import make_strategy
    from pushpull.torch.strategies.comm import make_comm

    torch.set_num_threads(1)
    bps.init()
    rank = bps.rank()
    comm = make_comm()
    prof = load_profile(spec["model"])
    probe = EmulatedModel(prof, 0.0, spec["size_scale"])
    nbytes = sum(p.numel() * 4 for p in probe.parameters())
    ntensors = sum(1 for _ in probe.parameters())
    del probe
    t_comm = _time_reduction(comm, nbytes, "grid.all")                 # one reduction of all gradients as one buffer
    t_small = _time_reduction(comm, 4096, "grid.small", reps=5)          # per-message cost: a 4 KB reduction
    t_stream = _time_stream(comm, 4096)                   # per-message cost when messages pipeline
    agreed = comm.broadcast_from_root(torch.tensor([t_comm, t_small, t_stream], dtype=torch.float64),
                                      "grid.agree")
    t_comm, t_small, t_stream = agreed.tolist()
    # the optimizers' own cost on the training thread (communication taken out), measured by every
    # worker at once, so under the job's load; rank 0's is recorded
    lw_runs = [r for r in spec["runs"] if r["layerwise"]]
    try:
        opt_probe = layerwise_probe(spec["model"], spec["size_scale"],
                                    base=(lw_runs[0] if lw_runs else spec["runs"][0])["base"],
                                    backend=bps.config().backend)
    except Exception as ex:  # noqa: BLE001 - a probe must not cost the job
        opt_probe = {"error": str(ex)[-300:]}
    bps.barrier()
    x = torch.zeros(1)
    runs = {}
    for r in spec["runs"]:
        model = EmulatedModel(prof, spec["compute_scale"], spec["size_scale"])
        if r["base"] == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ddp = DistributedDataParallel(model, bucket_cap_mb=r.get("bucket_mb", 25.0))  # comm made the group
            runs[r["name"]] = (ddp, torch.optim.SGD(model.parameters(), lr=0.0), None, False)
            continue
        named = [(f"{r['name']}.{n}", p) for n, p in model.named_parameters()]
        opts = dict(r.get("options") or {})
        if policy.get(r["base"]).schedules:  # its options are partition_bytes and credit (pushpull.policy.base)
            opts = {"partition_bytes": r["partition_bytes"], "credit": r["credit_bytes"]}
        strategy = make_strategy(r["base"], **opts)
        sgd = torch.optim.SGD(model.parameters(), lr=0.0)
        kw = {"compression": r["compression"]} if r.get("compression") else {}
        if r["layerwise"]:
            opt = bps.ScheduledOptimizer(model, sgd, named_parameters=named, strategy=strategy, **kw)
        else:
            opt = bps.DistributedOptimizer(sgd, named_parameters=named, strategy=strategy, model=model, **kw)
        runs[r["name"]] = (model, opt, strategy, r["layerwise"])
    times: dict[str, list[list[float]]] = {n: [] for n in runs}
    runs_spec = {r["name"]: r for r in spec["runs"]}
    # each host's link bytes per timed step, per strategy: its first local process reads the interface
    iface = bps.config().interface if bps.local_rank() == 0 else None  # PUSHPULL_INTERFACE / DMLC_INTERFACE
    link = {n: [0, 0, 0] for n in runs}  # received, sent, steps
    # (partition, credit) per strategy after its first block: the runs share one engine, and a strategy
    # that changes the key size (auto) would otherwise be reported for those that ran before it
    first_sched: dict[str, list] = {}
    for rnd in range(spec["tries"]):
        for name, (model, opt, _, lw) in runs.items():
            bps.barrier()
            warm = max(spec["warmup"], runs_spec[name].get("warmup") or 0) if rnd == 0 else 1
            block = []
            c0 = None
            for step in range(warm + spec["steps"]):
                if step == warm:
                    c0 = link_counters(iface)
                t0 = time.perf_counter()
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                if lw and step == warm + spec["steps"] - 1:
                    opt.synchronize()
                if step >= warm:
                    block.append(time.perf_counter() - t0)
            c1 = link_counters(iface)
            if c0 is not None and c1 is not None:
                link[name] = [link[name][0] + c1[0] - c0[0], link[name][1] + c1[1] - c0[1],
                              link[name][2] + spec["steps"]]
            times[name].append(block)
            strat = runs[name][2]
            if rnd == 0 and strat is not None:  # what its tensors were cut with, before the next one runs
                first_sched[name] = list(strat.scheduling())
    # every host's figures to rank 0 (a sum in which each host's first process fills its row)
    hosts = bps.size() // bps.local_size()
    names = list(runs)
    table = torch.zeros(hosts, len(names), 3, dtype=torch.float64)
    if iface:
        table[bps.rank() // bps.local_size()] = torch.tensor([link[n] for n in names], dtype=torch.float64)
    table = bps.push_pull(table, average=False, name="grid.link_bytes")
    link_bytes = {n: [{"rx": t[0] / t[2], "tx": t[1] / t[2]} if t[2] else None
                      for t in table[:, i].tolist()] for i, n in enumerate(names)}
    eng = bps.engine()
    local_active = bool(eng is not None and getattr(eng, "local", None) is not None)
    # how rank 0 reached the servers over TCP: "sealed" / "plain" lanes (PUSHPULL_DATA_LANE), none = ZeroMQ
    data_lanes = sorted(set(getattr(eng, "data_lanes", {}).values())) if eng is not None else []
    plans = {}
    # the (partition, credit) bytes each strategy ran with: the defaults unless the variant set them
    scheduling = {name: (list(st.scheduling()) if not policy.get(runs_spec[name]["base"]).fixed
                         else first_sched.get(name) or list(st.scheduling())) if st is not None else [None, None]
                  for name, (_, _, st, _) in runs.items()}
    for name, (_, _, st, _) in runs.items():
        try:
            plans[name] = st.describe_plan()
        except Exception:  # noqa: BLE001 - only fusion/mgwfbp describe a plan
            pass
    decisions = {name: st.decision for name, (_, _, st, _) in runs.items() if hasattr(st, "decision")}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"times": times, "bytes": nbytes, "tensors": ntensors, "t_comm": t_comm,
                       "t_small": t_small, "t_stream": t_stream, "plans": plans, "opt_probe": opt_probe,
                       "scheduling": scheduling, "decisions": decisions, "link_bytes": link_bytes,
                       "local_reduce_active": local_active, "data_lanes": data_lanes}, f)
    from pushpull.torch import allreduce_backend as allreduce

    allreduce.shutdown()  # also where auto joined the all-reduce group from a PS job
    bps.shutdown()
    return 0


# ---------------------------------------------------------------- driver --

def _rows_for(job: dict, res: dict, cfg: dict, mode: str, wall: float) -> list[dict]:
    rows = []
    for r in job["runs"]:
        blocks = res["times"][r["name"]]
        flat = [t for b in blocks for t in b]
        tries = [statistics.median(b) for b in blocks if b]
        step = statistics.median(flat)
        row = {k: job[k] for k in ("model", "backend", "workers", "servers", "placement", "bandwidth",
                                   "bandwidth_bytes_s", "delay", "ratio", "grad_mb", "repeat", "size_scale",
                                   "compute_scale", "batch_size", "ps_partition_bytes", "congestion", "auth",
                                   "local_size", "local_reduce")}
        if "congestion_asked" in job:
            row["congestion_asked"] = job["congestion_asked"]
        row.update({
            "config": cfg["name"], "strategy": r["name"], "base_strategy": r["base"], "layerwise": r["layerwise"],
            "partition_bytes": r["partition_bytes"], "credit_bytes": r["credit_bytes"],
            "compression": r["compression"], "mode": mode, "grad_bytes": res["bytes"], "tensors": res["tensors"],
            "t_comm_s": res["t_comm"], "t_small_s": res["t_small"], "t_stream_s": res.get("t_stream"),
            "compute_s": None, "step_s": step, "step_mean_s": statistics.mean(flat),
            "step_std_s": statistics.stdev(flat) if len(flat) > 1 else 0.0, "try_step_s": tries,
            "throughput": job["workers"] * job["local_size"] * job["batch_size"] / step,
            "try_throughput": [job["workers"] * job["local_size"] * job["batch_size"] / t for t in tries],
            "local_reduce_active": res.get("local_reduce_active"), "data_lanes": res.get("data_lanes"),
            "link_bytes": (res.get("link_bytes") or {}).get(r["name"]),
            "steps": len(flat), "plan": res.get("plans", {}).get(r["name"]), "job_wall_s": wall,
            "opt_probe": res.get("opt_probe"), "auto_decision": (res.get("decisions") or {}).get(r["name"]),
            # what the engine ran with (credit 0 = unlimited): defaults unless the variant set them
            "engine_partition_bytes": (res.get("scheduling") or {}).get(r["name"], [None, None])[0],
            "engine_credit_bytes": (res.get("scheduling") or {}).get(r["name"], [None, None])[1],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": socket.gethostname(), "cpus": os.cpu_count(),
        })
        from pushpull.profiles import load_profile

        row["compute_s"] = load_profile(job["model"]).compute_s * job["compute_scale"]
        if job.get("ps_partition_engine") and job["backend"] == "ps" and row["engine_partition_bytes"]:
            row["ps_partition_bytes"] = row["engine_partition_bytes"]
        rows.append(row)
    return rows


def run_grid(cfg: dict, out: Path, loopback: bool = False, log_dir: str | None = None,
             progress: bool = True, only: int | None = None) -> dict:
    from tqdm import tqdm

    from pushpull.emulate import EmulatedCluster, launch_job

    jobs = expand(cfg)
    done = {cell_key(r) for r in read_rows(out)}

    def cells(job):
        return [dict(job, strategy=r["name"]) for r in job["runs"]]

    pending = [j for j in jobs if any(cell_key(c) not in done for c in cells(j))]
    if only is not None:
        pending = pending[:only]
    skipped = sum(len(j["runs"]) for j in jobs) - sum(len(j["runs"]) for j in pending)
    stats = {"jobs": len(pending), "cells_skipped": skipped, "cells_run": 0, "failed": 0, "mode": None}
    out.parent.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple, list[dict]] = {}
    for j in pending:
        groups.setdefault((j["hosts"], j["bandwidth"], j["delay"], j["congestion"]), []).append(j)
    bar = tqdm(total=sum(len(j["runs"]) for j in pending), desc=f"grid {cfg['name']}", unit="cell",
               disable=not progress, file=sys.stderr)
    steps = {"steps": int(cfg.get("steps", 4)), "warmup": int(cfg.get("warmup", 4)), "tries": int(cfg.get("tries", 3))}
    timeout = float(cfg.get("timeout", 600))
    started = 0
    try:
        for (hosts, bw, delay, cc), gjobs in groups.items():
            with EmulatedCluster(hosts, rate=bw, delay=delay, force_loopback=loopback,
                                 congestion=None if cc == "inherit" else cc) as cluster:
                mode = "namespaces" if cluster.emulated else "loopback"
                stats["mode"] = mode
                for job in gjobs:
                    bar.set_postfix_str(f"{job['model']} {job['backend']} n={job['workers']} {bw} "
                                        f"r={job['ratio']:g} [{mode}]")
                    with tempfile.TemporaryDirectory(prefix="pushpull-grid-") as tmp:
                        res_path = os.path.join(tmp, "result.json")
                        spec = dict(steps, model=job["model"], size_scale=job["size_scale"],
                                    compute_scale=job["compute_scale"], runs=job["runs"])
                        argv = [sys.executable, "-m", "pushpull.bench.grid", "--child", json.dumps(spec),
                                "--result", res_path]
                        env = {"PUSHPULL_BACKEND": job["backend"], "PUSHPULL_AUTH": job["auth"],
                               "PUSHPULL_LOCAL_REDUCE": job["local_reduce"]}
                        if not job.get("ps_partition_engine"):
                            env["BYTEPS_PARTITION_BYTES"] = str(job["ps_partition_bytes"])
                        if cluster.emulated:
                            env["GLOO_SOCKET_IFNAME"] = cluster.iface
                        started += 1  # a failed job runs no cell: number the logs by jobs, not cells
                        jl = os.path.join(log_dir, f"job{started - 1}") if log_dir else None
                        t0 = time.monotonic()
                        try:
                            launch_job(cluster, job["workers"], job["servers"], argv, env=env,
                                       placement=job["placement"], log_dir=jl,
                                       local_size=job["local_size"]).wait(timeout)
                            with open(res_path) as f:
                                res = json.load(f)
                        except Exception as ex:  # noqa: BLE001 - one failed job must not end the grid
                            stats["failed"] += 1
                            tqdm.write(f"grid: job {job['model']}/{job['backend']}/n={job['workers']}/{bw}/"
                                       f"r={job['ratio']:g} failed: {str(ex)[-1500:]}", file=sys.stderr)
                            bar.update(len(job["runs"]))
                            continue
                        wall = time.monotonic() - t0
                    ran = cluster.congestion_in_force  # what the hosts ran (a machine may refuse the one asked)
                    if ran and ran != job["congestion"]:
                        job = dict(job, congestion=ran, congestion_asked=job["congestion"])
                    rows = [r for r in _rows_for(job, res, cfg, mode, wall) if cell_key(r) not in done]
                    with open(out, "a") as f:
                        for r in rows:
                            f.write(json.dumps(r) + "\n")
                    stats["cells_run"] += len(rows)
                    bar.update(len(job["runs"]))
    finally:
        bar.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        p = argparse.ArgumentParser()
        p.add_argument("--child", required=True)
        p.add_argument("--result", required=True)
        a = p.parse_args(argv)
        return child_main(json.loads(a.child), a.result)
    p = argparse.ArgumentParser(prog="pushpull bench grid", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="grid config (JSON), e.g. benchmarks/configs/bytescheduler_speedup.json")
    p.add_argument("--out", help="results file (default docs/results/<name>.jsonl)")
    p.add_argument("--loopback", action="store_true", help="no namespaces: run everything on 127.0.0.1")
    p.add_argument("--log-dir", help="keep every process's log here")
    p.add_argument("--max-jobs", type=int, default=None, help="run at most this many pending jobs")
    p.add_argument("--dry-run", action="store_true", help="list the pending jobs and exit")
    p.add_argument("--no-progress", action="store_true")
    for what in ("backends", "models", "strategies"):
        p.add_argument(f"--{what}", help=f"run only these of the config's {what} (comma-separated), e.g. to re-run "
                                         f"the cells of one backend after it changed; rows keep the config's name")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    try:
        cfg = restrict(cfg, **{w: getattr(args, w) for w in ("backends", "models", "strategies")})
    except ValueError as ex:
        p.error(str(ex))
    out = Path(args.out or Path("docs/results") / f"{cfg['name']}.jsonl")
    if args.dry_run:
        done = {cell_key(r) for r in read_rows(out)}
        for j in expand(cfg):
            todo = [r["name"] for r in j["runs"] if cell_key(dict(j, strategy=r["name"])) not in done]
            print(f"{j['model']:<12} {j['backend']:<9} n={j['workers']}x{j['local_size']} k={j['servers']} "
                  f"local_reduce={j['local_reduce']} {j['placement']:<9} "
                  f"{j['bandwidth']:<8} ratio={j['ratio']:<5g} rep={j['repeat']} scale={j['size_scale']:.4g} "
                  f"compute={j['compute_scale']:.4g} pending={todo}")
        return 0
    loop = args.loopback or os.environ.get("PUSHPULL_GRID_LOOPBACK", "") not in ("", "0")
    stats = run_grid(cfg, out, loopback=loop, log_dir=args.log_dir, progress=not args.no_progress,
                     only=args.max_jobs)
    print(f"pushpull bench grid: {cfg['name']}: {stats['cells_run']} cells run, {stats['cells_skipped']} "
          f"skipped (already in {out}), {stats['failed']} jobs failed; mode {stats['mode'] or '-'}")
    print(json.dumps(stats))
    return 1 if stats["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
