"""``pushpull bench scheduling``: every communication strategy on the same model
and cluster in one invocation; prints the step time of each and its speedup
over ``wfbp`` (and bytescheduler's over fusion).

How it runs: one launch of the real cluster (``pushpull launch``: scheduler,
K servers, N workers on this machine) whose workers loop over the
strategies. Each strategy gets its own copy of the model, with gradient names
prefixed by the strategy (so partitions and keys never mix), and the
strategies take turns in ``--rounds`` interleaved blocks of ``--steps`` steps,
so that a change in machine load hits all of them alike. The first block of
each strategy starts with ``--warmup`` untimed steps (fusion and MG-WFBP
measure and plan during those). The reported step time is the median over
rank 0's timed steps.

Models:

* a shipped profile (``vgg16``, ``resnet50``, ``bert_base``, ...) or a profile
  file: **emulated compute** (:mod:`pushpull.bench.emulated_model`): per-layer
  forward/backward times are replayed with sleeps, gradients have the
  profile's tensor sizes times ``--size-scale`` (default: shrink to about
  32 MB so it fits this machine), and communication is real.
  The computation-to-communication ratio is set explicitly: the workers first
  time a reduction of all the gradient bytes as one buffer (T_comm, median of
  3), then scale the profile's compute so that forward+backward =
  ``--ratio`` x T_comm (default 1), unless ``--compute-scale`` is given.
* ``mlp`` (a 10 M-parameter MLP with a few big layers) or a small model of
  :mod:`pushpull.bench.models` (``vgg_small``, ``resnet_small``, ...): real
  compute on this CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pushpull import policy
from pushpull.cli import help_text
from pushpull.config import DEFAULTS
from pushpull.bench.jobs import run_job

# the runtime's fixed strategies (pushpull.policy; auto picks among them), the reference (wfbp) first
STRATEGIES = sorted((p.name for p in policy.all_policies() if p.fixed and p.runtime != "-"),
                    key=lambda n: n != "wfbp")
# "<strategy>+lw": the same strategy with layer-wise updates (ScheduledOptimizer), which is how
# ByteScheduler is used: priorities only pay off when the next forward pass can start early
DEFAULT_RUNS = STRATEGIES + ["wfbp+lw", "bytescheduler+lw"]
TARGET_BYTES = 32e6


def _is_profile(model: str) -> bool:
    from pushpull.profiles import builtin_names

    return model in builtin_names() or model.endswith(".json")


# ---------------------------------------------------------------- worker side --

def _big_mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


def _model_factory(args, rank: int):
    """(make_model, run_loss, info) for the requested model."""
    import torch

    if _is_profile(args.model):
        from pushpull.bench.emulated_model import EmulatedModel
        from pushpull.profiles import load_profile

        prof = load_profile(args.model)
        size_scale = args.size_scale if args.size_scale else min(1.0, TARGET_BYTES / prof.nbytes)
        x = torch.zeros(1)
        info = {"kind": "emulated", "profile_compute_s": prof.compute_s, "size_scale": size_scale,
                "profile_bytes": prof.nbytes, "layers": len(prof.layers)}

        def make(compute_scale):
            return EmulatedModel(prof, compute_scale, size_scale)

        return make, (lambda m: m(x).sum()), info
    from pushpull.bench import models

    if args.model == "mlp":
        g = torch.Generator().manual_seed(rank)
        xb, yb = torch.randn(args.batch, 1024, generator=g), torch.randint(0, 10, (args.batch,), generator=g)

        def loss_fn(m):
            return torch.nn.functional.cross_entropy(m(xb), yb)

        return (lambda _scale: _big_mlp()), loss_fn, {"kind": "real", "size_scale": 1.0}
    batch, loss = models.example_batch(args.model, args.batch, seed=rank)

    def make_real(_scale):
        torch.manual_seed(0)
        return models.build_model(args.model)

    return make_real, (lambda m: loss(m, batch)), {"kind": "real", "size_scale": 1.0}


def _time_reduction(comm, nbytes: int, reps: int = 3) -> float:
    import torch

    buf = torch.zeros(max(1, nbytes // 4))
    comm.wait(comm.submit(buf, "bench.calibrate", 0))  # first use sets up keys: not timed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        comm.wait(comm.submit(buf, "bench.calibrate", 0))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def child_main(args) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.torch.executors import make_strategy
    from pushpull.torch.executors.comm import make_comm

    torch.set_num_threads(1)  # several processes share few cores
    bps.init()
    rank = bps.rank()
    comm = make_comm()
    make, run_loss, info = _model_factory(args, rank)
    probe = make(0.0)
    nbytes = sum(p.numel() * p.element_size() for p in probe.parameters())
    ntensors = sum(1 for _ in probe.parameters())
    t_comm = _time_reduction(comm, nbytes)
    if info["kind"] == "emulated":
        scale = args.compute_scale if args.compute_scale is not None else \
            args.ratio * t_comm / info["profile_compute_s"]
        info["compute_scale"] = scale
        t_comp = info["profile_compute_s"] * scale
    else:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            probe.zero_grad()
            run_loss(probe).backward()
            times.append(time.perf_counter() - t0)
        t_comp = statistics.median(times)
        scale = 1.0
    # every rank uses rank 0's numbers, so all replay the same compute
    agreed = comm.broadcast_from_root(torch.tensor([t_comm, t_comp, scale], dtype=torch.float64),
                                      "bench.agree")
    t_comm, t_comp, scale = agreed.tolist()
    del probe

    opts = {"bytescheduler": {k: v for k, v in (("partition_bytes", args.partition_bytes),
                                                ("credit", args.credit_bytes)) if v}}
    runs = {}
    for s in args.strategies:
        model = make(scale)
        named = [(f"{s}.{n}", p) for n, p in model.named_parameters()]
        base, layerwise = s.split("+")[0], s.endswith("+lw")
        strategy = make_strategy(base, **opts.get(base, {}))
        sgd = torch.optim.SGD(model.parameters(), lr=0.0)
        if layerwise:
            opt = bps.ScheduledOptimizer(model, sgd, named_parameters=named, strategy=strategy)
        else:
            opt = bps.DistributedOptimizer(sgd, named_parameters=named, strategy=strategy, model=model)
        runs[s] = (model, opt, strategy)
    times: dict[str, list[float]] = {s: [] for s in args.strategies}
    for rnd in range(args.rounds):
        for s in args.strategies:
            model, opt, _ = runs[s]
            bps.barrier()
            warm = args.warmup if rnd == 0 else 1
            for step in range(warm + args.steps):
                t0 = time.perf_counter()
                opt.zero_grad()
                run_loss(model).backward()
                opt.step()
                if s.endswith("+lw") and step == warm + args.steps - 1:
                    opt.synchronize()  # the block's last updates count, and nothing leaks into the next block
                if step >= warm:
                    times[s].append(time.perf_counter() - t0)
    bs = runs.get("bytescheduler") or runs.get("bytescheduler+lw")
    if bs is not None:
        st = bs[2]
        info["bytescheduler_partition_bytes"] = st.partition_bytes
        info["bytescheduler_credit_bytes"] = st.credit_bytes
    plans = {s: runs[s][2].describe_plan() for s in ("fusion", "mgwfbp") if s in runs}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"times": times, "bytes": nbytes, "tensors": ntensors, "t_comm": t_comm,
                       "t_comp": t_comp, "info": info, "plans": plans, "workers": bps.size(),
                       "servers": bps.config().num_server, "backend": bps.config().backend}, f)
    if bps.config().backend == "allreduce":
        from pushpull.torch import allreduce_backend as allreduce

        allreduce.shutdown()
    bps.shutdown()
    return 0


# ---------------------------------------------------------------- driver --

def summarize(r: dict) -> dict:
    med = {s: statistics.median(ts) for s, ts in r["times"].items()}
    out = {s: {"median_s": m, "mean_s": statistics.mean(r["times"][s]), "steps": len(r["times"][s])}
           for s, m in med.items()}
    if "wfbp" in med:
        for s in med:
            out[s]["speedup_vs_wfbp"] = med["wfbp"] / med[s]
    ratios = {}
    if "bytescheduler" in med:
        for base in ("wfbp", "fusion"):
            if base in med:
                ratios[f"bytescheduler_vs_{base}"] = med[base] / med["bytescheduler"]
    return {"strategies": out, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench scheduling", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", help="profile name/file (emulated) or mlp / a small model")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--backend", choices=["ps", "allreduce"], default=DEFAULTS.backend)
    p.add_argument("--steps", type=int, default=10, help="timed steps per strategy per round")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps before a strategy's first block")
    p.add_argument("--rounds", type=int, default=2, help="interleaved blocks per strategy")
    p.add_argument("--strategies", default=",".join(DEFAULT_RUNS),
                   help="comma-separated; NAME+lw = with layer-wise updates (default: %(default)s)")
    p.add_argument("--ratio", type=float, default=1.0,
                   help="emulated: forward+backward time / time of one reduction of all gradients")
    p.add_argument("--compute-scale", type=float, default=None,
                   help="emulated: multiply the profile's compute times by this instead of using --ratio")
    p.add_argument("--size-scale", type=float, default=None,
                   help=f"emulated: multiply tensor sizes (default: down to ~{TARGET_BYTES / 1e6:.0f} MB in all)")
    p.add_argument("--batch", type=int, default=32, help="real models: batch size")
    p.add_argument("--partition-bytes", type=int, default=None, help="bytescheduler partition size")
    p.add_argument("--credit-bytes", type=int, default=None, help="bytescheduler credit")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    p.add_argument("--json", action="store_true", help="last line: one JSON object with the results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s.split("+")[0] not in STRATEGIES or s.count("+") > 1
               or ("+" in s and not s.endswith("+lw"))]
    if unknown:
        p.error(f"--strategies: unknown {unknown}; choose from {', '.join(STRATEGIES)}")
    if args.child:
        return child_main(args)
    if args.workers < 2:
        p.error("--workers must be >= 2 (one worker has nothing to communicate)")
    if args.servers < 1:
        p.error("--servers must be >= 1 (the all-reduce backend also uses the scheduler for rendezvous)")
    if args.warmup < 3 and any(s.split("+")[0] in ("fusion", "mgwfbp") for s in args.strategies):
        p.error("--warmup must be >= 3: fusion and mgwfbp measure for 2 steps before planning")
    if not _is_profile(args.model) and args.model != "mlp":
        from pushpull.bench import models

        if args.model not in models.MODELS:
            p.error(f"--model {args.model!r}: not a profile, 'mlp' or a model of pushpull.bench.models")
    child = [sys.executable, "-m", "pushpull.bench.scheduling", "--child"]
    for a in ("model", "steps", "warmup", "rounds", "ratio", "compute_scale", "size_scale", "batch",
              "partition_bytes", "credit_bytes"):
        v = getattr(args, a)
        if v is not None:
            child += [f"--{a.replace('_', '-')}", str(v)]
    child += ["--strategies", ",".join(args.strategies)]
    r = run_job("pushpull bench scheduling", args.workers, args.servers, child, timeout=args.timeout,
                env={"PUSHPULL_BACKEND": args.backend})
    if r is None:
        return 1
    summary = summarize(r)
    info = r["info"]
    print(f"pushpull bench scheduling: model {args.model} ({info['kind']}), {r['workers']} workers, "
          f"{r['servers']} servers, backend {r['backend']}")
    if info["kind"] == "emulated":
        print(f"  gradients: {r['tensors']} tensors, {r['bytes'] / 1e6:.1f} MB "
              f"(profile {info['profile_bytes'] / 1e6:.1f} MB x size-scale {info['size_scale']:.4g})")
        print(f"  compute: profile {info['profile_compute_s'] * 1e3:.1f} ms x compute-scale "
              f"{info['compute_scale']:.4g} = {r['t_comp'] * 1e3:.1f} ms per step (sleeps)")
    else:
        print(f"  gradients: {r['tensors']} tensors, {r['bytes'] / 1e6:.1f} MB; compute (measured, one "
              f"process) {r['t_comp'] * 1e3:.1f} ms per step")
    print(f"  one reduction of all gradients: T_comm = {r['t_comm'] * 1e3:.1f} ms; "
          f"computation/communication = {r['t_comp'] / r['t_comm']:.2f}")
    if "bytescheduler_partition_bytes" in info:
        print(f"  bytescheduler: partition {info['bytescheduler_partition_bytes']} B, credit "
              f"{info['bytescheduler_credit_bytes']} B")
    for s, plan in r.get("plans", {}).items():
        print(f"  {plan}")
    print(f"  {'strategy':<18} {'median ms':>10} {'mean ms':>10} {'speedup vs wfbp':>16}")
    for s, v in summary["strategies"].items():
        sp = v.get("speedup_vs_wfbp")
        print(f"  {s:<18} {v['median_s'] * 1e3:10.1f} {v['mean_s'] * 1e3:10.1f} "
              f"{(f'{sp:.2f}x' if sp else '-'):>16}")
    for k, v in summary["ratios"].items():
        print(f"  {k.replace('_', ' ')}: {v:.2f}x")
    if args.json:
        print(json.dumps({"model": args.model, "backend": r["backend"], "workers": r["workers"],
                          "servers": r["servers"], "bytes": r["bytes"], "t_comm_s": r["t_comm"],
                          "t_comp_s": r["t_comp"], "info": info, **summary, "times": r["times"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
