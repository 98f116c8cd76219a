"""What runs inside each grid job: every worker process of one launch, started by the runner
(:mod:`pushpull.bench.grid`) as ``python -m pushpull.bench.grid_child --child SPEC --result PATH``.

Why a module of its own: it runs on the emulated hosts, in the job's processes, and needs none of the runner:
it times the probes (one reduction of all gradients, a small one, a stream of small ones, the optimizers'
own cost), then every strategy's steps in turns, reads the host link's byte counters around them, and rank 0
writes the figures to PATH. The timers and link counters are also used by ``pushpull bench probe`` and
``pushpull bench wire``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pushpull import policy
from pushpull.bench.layerwise_probe import layerwise_probe


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


def child_main(spec: dict, out: str) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.profiles import load_profile
    from pushpull.torch.executors import make_strategy
    from pushpull.torch.executors.comm import make_comm

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--child", required=True)
    p.add_argument("--result", required=True)
    a = p.parse_args(argv)
    return child_main(json.loads(a.child), a.result)


if __name__ == "__main__":
    sys.exit(main())
