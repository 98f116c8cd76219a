"""Why some steps of one emulated PS job are slower than others (how_useful's ``partition_only``).

``ps_key_timeline.py`` pictures one traced step; this runs ``--steps`` consecutive timed steps of one job with
the grid's strategy options (``--strategy bytescheduler+lw --credit inf`` is how_useful's ``partition_only``;
``--credit 231284`` its ``bytescheduler+lw``) and prints, per step, what could make it slow:

* per worker, the **training thread's CPU**: ``late``, how far after their deadlines the emulated model's
  sleeps woke (summed over the step): waiting for a CPU or for the GIL; ``run`` / ``rq``, that thread's time
  on a CPU and runnable but waiting for one (``/proc/self/task/TID/schedstat``); the same for the engine's
  I/O thread; ``start +``, how long after the first worker this one began the step;
* for the machine: the share of the step in which some task waited for a CPU (``/proc/pressure/cpu``), the
  CPUs busy (``/proc/stat``), and every link's idle share per direction (under 10 % of the rate, from the
  switch's counters, as ``ps_key_timeline.py`` reads them);
* per round, from the **servers'** timelines (``--server-trace``; the workers' timelines stay off, since
  writing them costs the training thread CPU at the end of every step): how far apart the four workers'
  pushes of one key arrived, which worker's push came last how often, and when each (server, worker) flow
  delivered its last push of the round (a worker's push to its own, colocated server crosses loopback).

    flock /tmp/pushpull-cpu.lock python benchmarks/ps_slow_steps.py --credit inf --server-trace --steps 15
    flock /tmp/pushpull-cpu.lock python benchmarks/ps_slow_steps.py --credit 231284 --server-trace --steps 15

Needs root (network namespaces); a diagnostic, not a test.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ps_key_timeline as pkt  # noqa: E402  (its link sampler, idle shares and trace loading)

WARM = 4  # untimed steps first


# ---------------------------------------------------------------- worker --

def _schedstat(tid: int) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for one) of one thread of this process."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            a, b, _ = f.read().split()
        return int(a), int(b)
    except OSError:
        return 0, 0


def _threads() -> dict[str, list[int]]:
    """This process's threads by role: the training thread, the engine's I/O thread, ZeroMQ's, the rest."""
    main = threading.main_thread().native_id
    py = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, list[int]] = {"main": [main], "io": [], "zmq": [], "other": []}
    for tid in map(int, os.listdir("/proc/self/task")):
        if tid == main:
            continue
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        name = py.get(tid, comm)
        out["io" if name.startswith("van-") else "zmq" if comm.startswith("ZMQbg") else "other"].append(tid)
    return out


def _local_servers(engine) -> list[int]:
    """The server ranks whose address is one of this host's (colocated: the one on this worker's host)."""
    import socket

    local = []
    for name, addr in engine.direct.servers.items():
        host = addr.split("://", 1)[1].rsplit(":", 1)[0]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((host, 0))  # only an address of this network namespace binds
            local.append(int(name[1:]))
        except OSError:
            pass
    return local


def worker_main(args) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.bench import emulated_model as em
    from pushpull.bench.grid_spec import _bytes, scaled_profile
    from pushpull.torch.executors import make_strategy

    late = [0.0, 0.0]  # this step's summed and largest wake-up lateness (s)

    def spend(self, seconds: float) -> None:  # the model's deadline clock, also timing each wake-up
        if self.deadline is None:
            self.start()
        self.deadline += seconds
        left = self.deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)
            d = time.perf_counter() - self.deadline
            late[0] += d
            late[1] = max(late[1], d)

    em._Clock.spend = spend
    os.environ["PUSHPULL_TRACE_ON"] = "0"  # the servers trace (--server-trace); the workers never
    torch.set_num_threads(1)
    bps.init()
    prof, size_scale, _ = scaled_profile(args.model, args.grad_mb)
    model = em.EmulatedModel(prof, args.compute_scale, size_scale)
    lw = args.strategy.endswith("+lw")
    base = args.strategy[:-3] if lw else args.strategy
    opts = {"partition_bytes": args.partition_bytes or None, "credit": _bytes(args.credit)} if args.credit else {}
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    if lw:
        opt = bps.ScheduledOptimizer(model, sgd, named_parameters=model.named_parameters(),
                                     strategy=make_strategy(base, **opts))
    else:
        opt = bps.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                       strategy=make_strategy(base, **opts), model=model)
    x = torch.zeros(1)
    steps = []
    roles: dict[str, list[int]] = {}
    bps.barrier()
    for i in range(WARM + args.steps):
        if i == 1:
            roles = _threads()  # once the engine's and ZeroMQ's threads exist
        before = {r: [_schedstat(t) for t in ts] for r, ts in roles.items()}
        late[:] = [0.0, 0.0]
        t_wall, t0 = time.time(), time.perf_counter()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        rec = {"t": t_wall, "s": time.perf_counter() - t0, "late": late[0], "late_max": late[1]}
        for r, ts in roles.items():
            after = [_schedstat(t) for t in ts]
            rec[r] = [sum(a[0] - b[0] for a, b in zip(after, before[r])) / 1e9,
                      sum(a[1] - b[1] for a, b in zip(after, before[r])) / 1e9]
        steps.append(rec)
    if hasattr(opt, "synchronize"):
        opt.synchronize()
    Path(f"{args.result}.{bps.rank()}").write_text(json.dumps({"steps": steps[WARM:],
                                                             "local_servers": _local_servers(bps.engine())}))
    bps.shutdown()
    return 0


# ---------------------------------------------------------------- driver --

def sample_cpu(stop: float, psi: list, busy: list) -> None:
    """The machine's CPU pressure (us in which some task waited) and busy CPU time (s) over time."""
    hz = os.sysconf("SC_CLK_TCK")
    while time.time() < stop:
        t = time.time()
        with open("/proc/pressure/cpu") as f:
            psi.append((t, int(f.readline().split()[-1].split("=")[1])))
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy.append((t, (sum(v) - v[3] - v[4]) / hz))  # all but idle and iowait
        time.sleep(0.005)


def _at(rows: list, t: float) -> float:
    """A counter sampled as (time, value) rows, interpolated at ``t``."""
    for (ta, va), (tb, vb) in zip(rows, rows[1:]):
        if ta <= t <= tb:
            return va + (vb - va) * (t - ta) / max(tb - ta, 1e-9)
    return rows[-1][1] if rows and t > rows[-1][0] else (rows[0][1] if rows else 0.0)


def step_rows(res: dict, n: int, rate_Bps: float, psi: list, busy: list, samples: dict) -> list[dict]:
    rows = []
    for i in range(len(res[0]["steps"])):
        st = [res[r]["steps"][i] for r in range(n)]
        t0 = min(s["t"] for s in st)
        t1 = max(s["t"] + s["s"] for s in st)
        row = {"step": WARM + i, "s": statistics.median(s["s"] for s in st),
               "psi": (_at(psi, t1) - _at(psi, t0)) / 1e6 / max(t1 - t0, 1e-9),
               "busy": (_at(busy, t1) - _at(busy, t0)) / max(t1 - t0, 1e-9),
               "idle": pkt.idle_fractions(samples, t0, t1, rate_Bps), "workers": []}
        for r, s in enumerate(st):
            main, io = s.get("main", [0, 0]), s.get("io", [0, 0])
            row["workers"].append({"rank": r, "s": s["s"], "start": s["t"] - t0, "late": s["late"],
                                   "late_max": s["late_max"], "run": main[0], "rq": main[1], "io_run": io[0],
                                   "io_rq": io[1], "zmq_run": s.get("zmq", [0, 0])[0]})
        rows.append(row)
    return rows


def round_rows(trace_dir: str, n: int, local: set[tuple[int, int]]) -> list[dict]:
    """Per round, from the servers' timelines: the spread of one key's pushes, who came last, and when each
    (server, worker) flow delivered its last push (ms after the round's first push arrived)."""
    arrivals: dict[int, dict[tuple, dict[int, float]]] = {}
    for f in glob.glob(f"{trace_dir}/server*/timeline.json"):
        server = int(Path(f).parent.name[len("server"):])
        events, t0 = pkt._load(f)
        for e in events:
            a = e.get("args") or {}
            if e.get("ph") == "i" and "key" in a:
                arrivals.setdefault(a["round"], {}).setdefault((server, a["key"]), {})[a["rank"]] = \
                    t0 + e["ts"] / 1e6
    rows = []
    for rnd in sorted(arrivals):
        keys = [d for d in arrivals[rnd].values() if len(d) == n]
        if not keys:
            continue
        first = min(min(d.values()) for d in keys)
        spread = sorted(max(d.values()) - min(d.values()) for d in keys)
        last = [max(d, key=d.get) for d in keys]
        flows: dict[tuple, float] = {}
        for (server, _), d in ((k, d) for k, d in arrivals[rnd].items() if len(d) == n):
            for w, t in d.items():
                flows[(server, w)] = max(flows.get((server, w), 0.0), t - first)
        rows.append({"round": rnd, "keys": len(keys), "spread_med": statistics.median(spread),
                     "spread_p90": spread[int(0.9 * (len(spread) - 1))],
                     "last_by": [last.count(w) for w in range(n)],
                     "local_flows": sorted(t for f, t in flows.items() if f in local),
                     "remote_flows": sorted(t for f, t in flows.items() if f not in local)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--model", default="vgg16")
    p.add_argument("--grad-mb", type=float, default=8.0)
    p.add_argument("--ratio", type=float, default=0.25, help="compute / (M / link rate)")
    p.add_argument("--strategy", default="bytescheduler+lw", help="a strategy, NAME+lw for layer-wise updates")
    p.add_argument("--partition-bytes", type=int, default=0, help="0: the grid's scaled default")
    p.add_argument("--credit", default="inf", help="bytes, or 'inf' (unlimited); '' = the strategy's default")
    p.add_argument("--steps", type=int, default=15, help="timed steps (after 4 untimed ones)")
    p.add_argument("--server-trace", action="store_true", help="the servers' timelines (when each push arrived)")
    p.add_argument("--congestion", default="cubic", help="emulated hosts' TCP congestion control ('inherit')")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compute-scale", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)

    from pushpull.bench.grid_spec import _scaled_scheduling, compute_scale_for, scaled_profile, scaled_ps_partition_bytes
    from pushpull.emulate import EmulatedCluster, launch_job
    from pushpull.sim.config import parse_bandwidth

    n = args.workers
    prof, size_scale, grad_bytes = scaled_profile(args.model, args.grad_mb)
    rate_Bps = parse_bandwidth(args.rate)
    compute_scale = compute_scale_for(prof, grad_bytes, rate_Bps, args.ratio)
    tmp = tempfile.mkdtemp(prefix="ps-slow-steps-")
    env = {"BYTEPS_PARTITION_BYTES": str(scaled_ps_partition_bytes(size_scale, n))}  # as the grid scales it (k = n)
    if args.server_trace:  # a tensor's round r is step r - 1: rounds WARM + 1 .. of the timed steps
        env.update({"PUSHPULL_TRACE_ON": "1", "PUSHPULL_TRACE_DIR": f"{tmp}/trace",
                    "PUSHPULL_TRACE_START_STEP": str(WARM), "PUSHPULL_TRACE_END_STEP": str(WARM + args.steps)})
    base = args.strategy[:-3] if args.strategy.endswith("+lw") else args.strategy
    part = args.partition_bytes
    if not part and args.credit:  # the grid's scaled default partition
        part = _scaled_scheduling({"base": base, "partition_bytes": None, "credit_bytes": 1}, "ps",
                                  size_scale)["partition_bytes"]
    psi: list = []
    busy: list = []
    seconds = 30 + 2 * (WARM + args.steps)
    with EmulatedCluster(n, rate=args.rate, congestion=None if args.congestion == "inherit" else args.congestion) as c:
        if not c.emulated:
            print("ps_slow_steps: network namespaces are unavailable here (needs root)", file=sys.stderr)
            return 2
        sampler = subprocess.Popen([sys.executable, pkt.__file__, "--sample", "--switch", c.switch_ns, "--hosts",
                                    c.ns(0), "--seconds", str(seconds), "--result", f"{tmp}/samples.json"])
        threading.Thread(target=sample_cpu, args=(time.time() + seconds, psi, busy), daemon=True).start()
        worker = [sys.executable, os.path.abspath(__file__), "--worker", "--model", args.model,
                  "--grad-mb", str(args.grad_mb), "--compute-scale", repr(compute_scale), "--strategy",
                  args.strategy, "--partition-bytes", str(part), "--credit", args.credit, "--steps",
                  str(args.steps), "--result", f"{tmp}/result.json"]
        job = launch_job(c, n, n, worker, env=env, placement="colocated", log_dir=f"{tmp}/logs")
        job.wait(300)
        sampler.wait(seconds + 30)
    samples = json.loads(Path(f"{tmp}/samples.json").read_text())
    res = {r: json.loads(Path(f"{tmp}/result.json.{r}").read_text()) for r in range(n)}
    steps = step_rows(res, n, rate_Bps, psi, busy, samples)
    local = {(srv, r) for r in range(n) for srv in res[r]["local_servers"]}  # (server, worker) over loopback
    rounds = round_rows(f"{tmp}/trace", n, local) if args.server_trace else []
    print(f"{args.model} {grad_bytes / 1e6:.1f} MB, {n} workers, {n} colocated servers, {args.rate}, "
          f"{args.strategy}, partition {part or 'default'}, credit {args.credit or 'default'}; the links' bound "
          f"2(n-1)/n M/B = {2 * (n - 1) / n * grad_bytes / rate_Bps * 1e3:.0f} ms, compute c = "
          f"{args.ratio * grad_bytes / rate_Bps * 1e3:.0f} ms (raw in {tmp})")
    for s in steps:
        print(f"step {s['step']}: median {s['s'] * 1e3:.0f} ms; CPU pressure {s['psi'] * 100:.0f} % of the step, "
              f"{s['busy']:.2f} of {os.cpu_count()} CPUs busy; links idle (up/down) "
              + ", ".join(f"h{h} {v['up'] * 100:.0f}/{v['down'] * 100:.0f} %" for h, v in sorted(s["idle"].items())))
        for w in s["workers"]:
            print(f"   w{w['rank']}: {w['s'] * 1e3:4.0f} ms, start +{w['start'] * 1e3:3.0f}; training thread: late "
                  f"{w['late'] * 1e3:5.1f} (max {w['late_max'] * 1e3:4.1f}), run {w['run'] * 1e3:5.1f}, rq "
                  f"{w['rq'] * 1e3:5.1f}; I/O thread run {w['io_run'] * 1e3:5.1f}, rq {w['io_rq'] * 1e3:5.1f}; "
                  f"ZeroMQ run {w['zmq_run'] * 1e3:5.1f} ms")
    for r in rounds:
        local, remote = r["local_flows"] or [0.0], r["remote_flows"]
        print(f"round {r['round']}: {r['keys']} keys; one key's pushes arrive spread over median "
              f"{r['spread_med'] * 1e3:.0f} ms (p90 {r['spread_p90'] * 1e3:.0f}); last push by worker "
              + " ".join(f"w{w}:{c}" for w, c in enumerate(r["last_by"]))
              + f"; (server, worker) flows' last push in at: {len(r['local_flows'])} local "
              f"{min(local) * 1e3:.0f}-{max(local) * 1e3:.0f} ms, {len(remote)} remote "
              + " ".join(f"{t * 1e3:.0f}" for t in remote) + " ms")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "steps": steps, "rounds": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
