"""``pushpull bench probe``: the per-call cost of a tiny reduction on *this* machine, before any run, as
the simulator takes it (``pushpull sim --message-s --latency``, ``benchmarks/validate_sim.py --host-probe``).

Why: the simulator's uncalibrated prediction knows the link rate and the profile, and charges 50 µs per
message. A reduction also costs CPU per call (Python, ZeroMQ or gloo dispatch, thread hand-offs), which a
fast link does not hide: a model with hundreds of tensors over gloo pays it hundreds of times per step.
How much depends on the machine and on how many of the job's processes share its cores, so no default
fits every machine, but a user can measure it on their own machine without the cluster: this runs the
job's workers (and servers) on this machine over loopback and times, on each backend, what the grid's
jobs time on their cluster -- one 4 KB reduction alone (``t_small_s``, the median of ``--reps``) and one
in a stream of 16 (``t_stream_s``). Over loopback the wire costs nearly nothing, so what is measured is
the per-call cost; the network's rate and delay are the simulator's to add.

Run it with the processes per machine the job will have: the emulated cluster puts all of its hosts on
this machine, so its probe is ``--workers N --servers N`` here. Printed: per backend the two times and
what they mean for the simulator (:func:`pushpull.sim.config.per_call_costs`, the mapping the ``auto``
strategy applies to its own start-up probes: over PS the stream's time per reduction is a per-message CPU stage,
``--message-s``; what one reduction alone takes beyond it is latency, split over a push and a pull,
``--latency``; over all-reduce the backend fuses the stream into one or two collectives, so only the
reduction alone counts: an order message and one collective, half of it each, the collective's half over the
ring's 2(n-1) steps); ``--out FILE`` appends one JSON line per backend. Beside the all-reduce backend it prints its
peer: gloo's own ``all_reduce`` of the same 4 KB, alone and in a stream of 16, in the same processes (on a
machine whose cores the ranks share, gloo's own cost is what bounds the backend's, not a 1-float figure).

It also measures what the data path costs per *byte* (:mod:`pushpull.bench.cpu_probe`: a socket's send and
receive, ZeroMQ's, CURVE's and AES-GCM's extra, a float32 sum, as CPU-seconds per GB), prints what that
makes per role (a PS worker, a PS server, a ring rank) and stores the primitives as ``cpu_*`` fields in every
row, which ``pushpull plan --probe FILE``, ``pushpull sim --probe FILE``, PUSHPULL_HOST_PROBE (the ``auto``
strategy) and ``benchmarks/validate_sim.py --host-probe`` turn into the simulator's
:class:`~pushpull.sim.config.CpuCosts`. ``--cpu-only`` measures only that (a few seconds, no job started) and
appends one row of ``"kind": "cpu"``; ``--no-cpu`` skips it.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from pushpull.bench.jobs import run_job
from pushpull.cli import help_text
from pushpull.sim.config import per_call_costs

BACKENDS = ("ps", "allreduce")
PROBE_BYTES = 4096   # the grid jobs' small reduction


def child_main(args) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.bench.grid_child import _time_reduction, _time_stream
    from pushpull.torch.executors.comm import make_comm

    torch.set_num_threads(1)
    bps.init()
    comm = make_comm()   # the job's backend (PUSHPULL_BACKEND), as a training job gets it
    bps.barrier()
    small = _time_reduction(comm, PROBE_BYTES, "probe.small", reps=args.reps)
    stream = _time_stream(comm, PROBE_BYTES, reps=max(3, args.reps // 10))
    gloo = [float("nan")] * 2
    if bps.config().backend == "allreduce":  # the peer: gloo's own all_reduce, same processes, same sizes
        gloo = _time_gloo(args.reps)
    # rank 0's figures go to every rank, as the grid's jobs agree on theirs
    agreed = comm.broadcast_from_root(torch.tensor([small, stream, *gloo], dtype=torch.float64), "probe.agree")
    bps.barrier()
    if bps.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"workers": bps.size(), "servers": bps.config().num_server, "backend": bps.config().backend,
                       "t_small_s": float(agreed[0]), "t_stream_s": float(agreed[1]),
                       "gloo_small_s": float(agreed[2]), "gloo_stream_s": float(agreed[3])}, f)
    bps.shutdown()
    return 0


def _time_gloo(reps: int) -> list[float]:
    """gloo's raw ``all_reduce`` of the probe's 4 KB in the all-reduce job's own process group: alone (median
    of ``reps``) and in a stream of 16 issued at once (per reduction), as the backend's figures are timed."""
    import statistics

    import torch
    import torch.distributed as dist

    bufs = [torch.zeros(PROBE_BYTES // 4) for _ in range(16)]
    dist.all_reduce(bufs[0])   # warm-up, as the backend's first use is not timed
    dist.barrier()
    alone = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dist.all_reduce(bufs[0])
        alone.append(time.perf_counter() - t0)
    dist.barrier()
    stream = []
    for _ in range(max(3, reps // 10)):
        t0 = time.perf_counter()
        for w in [dist.all_reduce(b, async_op=True) for b in bufs]:
            w.wait()
        stream.append((time.perf_counter() - t0) / len(bufs))
    return [statistics.median(alone), statistics.median(stream)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench probe", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4, help="worker processes on this machine (default 4)")
    p.add_argument("--servers", type=int, help="server processes on this machine (default: as many as workers)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="ps, allreduce or both (default)")
    p.add_argument("--reps", type=int, default=50, help="timed tiny reductions per backend (default 50)")
    p.add_argument("--out", help="append one JSON line per backend to this file")
    p.add_argument("--cpu-only", action="store_true",
                   help="measure only the CPU cost per byte (no job started); --out appends one row")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU cost per byte")
    p.add_argument("--cpu-mb", type=int, default=256, help="MiB per CPU-cost transfer (default 256)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.workers < 2:
        p.error("--workers must be >= 2")
    bad = set(args.backends.split(",")) - set(BACKENDS)
    if bad:
        p.error(f"--backends: unknown {sorted(bad)}; choose from {', '.join(BACKENDS)}")
    servers = args.servers or args.workers
    load_before = list(os.getloadavg())
    t0 = time.time()
    cpu: dict = {}
    if not args.no_cpu:
        from pushpull.bench import cpu_probe

        print(f"CPU per byte on this machine ({socket.gethostname()}, {os.cpu_count()} cores), CPU-seconds "
              f"(user+sys) per GB moved, median of 3 x {args.cpu_mb} MiB:")
        cpu = cpu_probe.measure(args.cpu_mb << 20, reps=3)
        print("\n".join(cpu_probe.describe(cpu)))
        print("\n".join(cpu_probe.roles(cpu, args.workers, servers)))
    if args.cpu_only:
        row = {"kind": "cpu", **cpu, "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)),
               "machine": socket.gethostname(), "cpus": os.cpu_count(), "loadavg_before": load_before,
               "loadavg_after": list(os.getloadavg())}
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        return 0
    print(f"per-call cost on this machine ({socket.gethostname()}, {os.cpu_count()} cores): "
          f"{args.workers} workers, {servers} server(s), over loopback")
    rows = []
    for backend in args.backends.split(","):
        # one job per backend, configured as a training job over it is; each worker process stands for a
        # host of its own (no shared-memory local reduce between processes of this machine)
        r = run_job("pushpull bench probe", args.workers, servers,
                    [sys.executable, "-m", "pushpull.bench.probe", "--child", "--reps", str(args.reps)], timeout=600,
                    env={"PUSHPULL_BACKEND": backend, "PUSHPULL_LOCAL_REDUCE": "off"})
        if r is None:
            return 1
        lat, msg = per_call_costs(backend, r["workers"], r["t_small_s"], r["t_stream_s"])
        print(f"  {backend:<9} one 4 KB reduction {r['t_small_s'] * 1e3:6.2f} ms, in a stream of 16 "
              f"{r['t_stream_s'] * 1e3:6.2f} ms each  ->  pushpull sim --backend {backend} "
              f"--message-s {msg * 1e6:.0f}us --latency {lat * 1e6:.0f}us")
        if r.get("gloo_small_s") == r.get("gloo_small_s"):  # not NaN: the all-reduce job timed its peer
            print(f"  {'gloo':<9} one 4 KB all_reduce  {r['gloo_small_s'] * 1e3:6.2f} ms, in a stream of 16 "
                  f"{r['gloo_stream_s'] * 1e3:6.2f} ms each  (torch.distributed, same processes): "
                  f"{backend} / gloo {r['t_small_s'] / r['gloo_small_s']:.2f}x alone, "
                  f"{r['t_stream_s'] / r['gloo_stream_s']:.2f}x in a stream")
        rows.append({"backend": backend, "workers": r["workers"], "servers": r["servers"],
                     "t_small_s": r["t_small_s"], "t_stream_s": r["t_stream_s"], "latency_s": lat, "message_s": msg,
                     "gloo_small_s": r.get("gloo_small_s"), "gloo_stream_s": r.get("gloo_stream_s"),
                     "reps": args.reps, **cpu,
                     "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)), "machine": socket.gethostname(),
                     "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": list(os.getloadavg())})
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
