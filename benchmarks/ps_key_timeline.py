"""Where a parameter-server step's time goes, per key, on the emulated cluster.

One job of the ``byteps_ps_vs_allreduce`` grid's shape (VGG-16 profile scaled to
8 MB, 4 workers, 4 servers on hosts of their own, compute 0.25 x M/B, WFBP) with
the timelines on (``PUSHPULL_TRACE_ON=1``) on workers *and* servers, while a
sampler inside the namespaces reads, every few milliseconds, every link's byte
counters per direction (``/proc/net/dev`` of the switch: ``vb<i>`` transmit =
host i's downlink, receive = its uplink) and the kernel's TCP send queues of
worker 0 and server 0 (``/proc/net/tcp``).

Prints, for the traced step: its time against the bound c + M/B, each link's
mean rate per direction, when the keys' rounds completed on the servers, the
drops of every token bucket; writes a three-panel picture (per-key timeline of
worker 0, link rate per direction, kernel send queues) and the raw samples.

    python benchmarks/ps_key_timeline.py --rate 100mbit --out docs/results/ps_key_timeline
    python benchmarks/ps_key_timeline.py --env PUSHPULL_BATCH_BYTES=65536 --env BYTEPS_PARTITION_BYTES=500000 \\
        --congestion inherit --out docs/results/ps_key_timeline_fc34bbf     # the settings of fc34bbf

Needs root (network namespaces); a diagnostic, not a test.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
TRACE_STEP = 4          # the traced step (after 4 untimed ones)
STEPS = TRACE_STEP + 2  # one more after it, so the traced step ends with the optimizer's next step


# ---------------------------------------------------------------- sampler (inside the namespaces) --

def _enter(ns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns({ns})")
    os.close(fd)


def _tcp_send_queue() -> int:
    """Bytes queued in the kernel for sending, over every TCP socket of this thread's namespace."""
    total = 0
    with open("/proc/thread-self/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            total += int(parts[4].split(":")[0], 16)
    return total


def sample_main(args) -> int:
    """Sample until ``--seconds`` pass; write one JSON file."""
    out: dict[str, list] = {"links": [], "sendq": {}}
    stop = time.time() + args.seconds

    def links() -> None:
        _enter(args.switch)
        while time.time() < stop:
            t = time.time()
            row = {}
            with open("/proc/thread-self/net/dev") as f:
                for line in f:
                    if ":" in line and line.strip().startswith("vb"):
                        name, rest = line.split(":", 1)
                        v = rest.split()
                        row[name.strip()] = (int(v[0]), int(v[8]))  # rx bytes (host uplink), tx (downlink)
            out["links"].append((t, row))
            time.sleep(args.interval)

    def sendq(ns: str) -> None:
        _enter(ns)
        rows = out["sendq"].setdefault(ns, [])
        while time.time() < stop:
            rows.append((time.time(), _tcp_send_queue()))
            time.sleep(args.interval)

    def tcpinfo(ns: str) -> None:
        """``ss -tin`` every ``--ss-interval`` s: per connection cwnd, unacked, retrans, lost, rto, send queue."""
        _enter(ns)  # the child inherits this thread's namespace
        rows = out.setdefault("ss", {}).setdefault(ns, [])
        while time.time() < stop:
            t = time.time()
            r = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True)
            rows.append((t, r.stdout))
            time.sleep(args.ss_interval)

    threads = [threading.Thread(target=links)] + [threading.Thread(target=sendq, args=(ns,)) for ns in args.hosts]
    if args.ss_interval > 0:
        threads += [threading.Thread(target=tcpinfo, args=(ns,)) for ns in dict.fromkeys(args.hosts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    Path(args.result).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------- worker --

def worker_main(args) -> int:
    import torch

    import pushpull.torch as bps
    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.bench.grid_spec import scaled_profile
    from pushpull.bench.grid_spec import _bytes
    from pushpull.torch.executors import make_strategy

    torch.set_num_threads(1)
    bps.init()
    prof, size_scale, _ = scaled_profile(args.model, args.grad_mb)
    model = EmulatedModel(prof, args.compute_scale, size_scale)
    base = args.strategy[:-3] if args.strategy.endswith("+lw") else args.strategy
    opts = {}
    if args.partition_bytes or args.credit:  # a scheduling strategy's options, as the grid passes them
        opts = {"partition_bytes": args.partition_bytes or None,
                "credit": _bytes(args.credit) if args.credit else None}  # 'inf': as the grid passes it
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    if args.strategy.endswith("+lw"):  # layer-wise updates (the grid's NAME+lw)
        opt = bps.ScheduledOptimizer(model, sgd, named_parameters=model.named_parameters(),
                                     strategy=make_strategy(base, **opts))
    else:
        opt = bps.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                       strategy=make_strategy(base, **opts), model=model)
    x = torch.zeros(1)
    times = []
    for _ in range(STEPS):
        bps.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        times.append((time.time() - (time.perf_counter() - t0), time.perf_counter() - t0))
    if hasattr(opt, "synchronize"):
        opt.synchronize()
    if bps.rank() == 0:
        Path(args.result).write_text(json.dumps({"steps": times, "compute_s": model.compute_s,
                                                 "bytes": model.nbytes}))
    bps.shutdown()
    return 0


# ---------------------------------------------------------------- driver --

NSTAT = ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes", "TcpExtTCPSpuriousRTOs",
         "TcpExtTCPFastRetrans", "TcpExtTCPSlowStartRetrans")


def _nstat(ns: str) -> dict:
    """A host's absolute TCP counters (nstat, history untouched)."""
    r = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-asz", *NSTAT], capture_output=True, text=True)
    return {p[0]: int(p[1]) for p in (line.split() for line in r.stdout.splitlines()[1:]) if len(p) >= 2}


def _load(path: str) -> tuple[list[dict], float]:
    from pushpull.timeline import load_trace

    events, meta = load_trace(path)
    return events, meta["t0_unix_us"] / 1e6


def analyse(tmp: str, res: dict, samples: dict, hosts: list[int]) -> dict:
    t_start, step_s = res["steps"][TRACE_STEP]
    t_end = t_start + step_s
    # worker 0: partition push (sent) and pull (answer arrived), by key
    ev, t0 = _load(f"{tmp}/trace/0/timeline.json")
    parts: dict[int, dict] = {}
    for e in ev:
        a = e.get("args") or {}
        if e.get("ph") == "X" and e["name"] in ("push", "pull") and a.get("step") == TRACE_STEP:
            d = parts.setdefault(a["key"], {"server": a["server"], "bytes": a["bytes"], "round": a["round"]})
            ts = t0 + e["ts"] / 1e6
            if e["name"] == "push":
                d["sent"] = ts
            else:
                d["resp"] = ts + e["dur"] / 1e6
    for f in glob.glob(f"{tmp}/trace/server*/timeline.json"):
        sev, st0 = _load(f)
        for e in sev:
            a = e.get("args") or {}
            if a.get("key") not in parts:
                continue
            d = parts[a["key"]]
            if a.get("round") != d["round"]:
                continue
            ts = st0 + e["ts"] / 1e6
            if e.get("ph") == "i":
                d.setdefault("arrivals", {})[a["rank"]] = ts
            elif e.get("ph") == "X":
                d["round_start"], d["round_end"] = ts, ts + e["dur"] / 1e6
    keys = [d for d in parts.values() if {"sent", "resp", "round_end"} <= d.keys()]
    # link rates over the step, per direction (bytes/s), from the switch's counters
    link = samples["links"]
    inside = [(t, row) for t, row in link if t_start <= t <= t_end]
    rates = {}
    if len(inside) >= 2:
        (ta, ra), (tb, rb) = inside[0], inside[-1]
        for h in hosts:
            port = f"vb{h}"
            rates[h] = {"up": (rb[port][0] - ra[port][0]) / (tb - ta), "down": (rb[port][1] - ra[port][1]) / (tb - ta)}
    ends = sorted(d["round_end"] - t_start for d in keys)
    return {"t_start": t_start, "step_s": step_s, "keys": keys, "rates": rates, "round_ends": ends}


def idle_fractions(samples: dict, t0: float, t1: float, rate_Bps: float, win: int = 2) -> dict:
    """Per host and direction, the fraction of the step's sample intervals (``win`` samples each) in which
    the link carried under 10 % of its rate."""
    link = [(t, row) for t, row in samples["links"] if t0 <= t <= t1]
    out = {}
    for port in (link[0][1] if link else {}):
        h = int(port[2:])
        for di, direction in enumerate(("up", "down")):
            n = low = 0
            for j in range(win, len(link), win):
                dt = link[j][0] - link[j - win][0]
                n += 1
                low += (link[j][1][port][di] - link[j - win][1][port][di]) / dt < 0.1 * rate_Bps
            out.setdefault(h, {})[direction] = low / max(1, n)
    return out


def plot(summary: dict, samples: dict, hosts: list[int], rate_Bps: float, bound_s: float, title: str,
         path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = summary["t_start"]
    t1 = t0 + summary["step_s"]
    fig, (ax, axl, axq) = plt.subplots(3, 1, figsize=(10, 10), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1.4, 1]})
    keys = sorted(summary["keys"], key=lambda d: d["sent"])
    for i, d in enumerate(keys):
        ms = lambda t: (t - t0) * 1e3  # noqa: E731
        arr0 = d.get("arrivals", {}).get(0, d["round_start"])
        ax.plot([ms(d["sent"]), ms(arr0)], [i, i], color="tab:blue", lw=1.6, solid_capstyle="butt")
        ax.plot([ms(d["round_start"]), ms(d["round_end"])], [i + 0.3, i + 0.3], color="tab:orange", lw=1.2,
                solid_capstyle="butt")
        ax.plot([ms(d["round_end"]), ms(d["resp"])], [i, i], color="tab:green", lw=1.6, solid_capstyle="butt")
    ax.plot([], [], color="tab:blue", label="worker 0's push (sent -> arrived at its server)")
    ax.plot([], [], color="tab:orange", label="server's round (first push -> last push: sum complete)")
    ax.plot([], [], color="tab:green", label="pull (round complete -> answer at worker 0)")
    ax.axvline(bound_s * 1e3, color="k", ls="--", lw=1, label=f"bound c + M/B = {bound_s * 1e3:.0f} ms")
    ax.set_ylabel("key (in order of worker 0's push)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=10)
    link = samples["links"]
    win = 4  # samples per rate point (smoothing)
    colors = {"up": "tab:blue", "down": "tab:green"}
    for h, label, ls in ((hosts[0], "worker 0", "-"), (hosts[1], "server 0", ":")):
        port = f"vb{h}"
        for di, direction in enumerate(("up", "down")):
            xs, ys = [], []
            for j in range(win, len(link)):
                if link[j][0] < t0 - 0.05 or link[j - win][0] > t1 + 0.05:
                    continue
                dt = link[j][0] - link[j - win][0]
                xs.append(((link[j][0] + link[j - win][0]) / 2 - t0) * 1e3)
                ys.append((link[j][1][port][di] - link[j - win][1][port][di]) / dt * 8 / 1e6)
            axl.plot(xs, ys, ls=ls, color=colors[direction], label=f"{label} {direction}link")
    axl.axhline(rate_Bps * 8 / 1e6, color="k", lw=0.8, ls="--", label="link rate")
    axl.set_ylabel("Mbit/s")
    axl.legend(loc="lower right", fontsize=7, ncol=3)
    for ns, rows in samples["sendq"].items():
        xs = [(t - t0) * 1e3 for t, _ in rows if t0 - 0.05 <= t <= t1 + 0.05]
        ys = [q / 1e3 for t, q in rows if t0 - 0.05 <= t <= t1 + 0.05]
        axq.plot(xs, ys, label=("worker 0" if ns.endswith(f"h{hosts[0]}") else "server 0"))
    axq.set_ylabel("kernel TCP send\nqueue (kB)")
    axq.set_xlabel("ms since the traced step began")
    axq.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--placement", default="separate", choices=["separate", "colocated"])
    p.add_argument("--model", default="vgg16")
    p.add_argument("--grad-mb", type=float, default=8.0)
    p.add_argument("--ratio", type=float, default=0.25, help="compute / (M / link rate)")
    p.add_argument("--strategy", default="wfbp", help="a strategy, NAME+lw for layer-wise updates")
    p.add_argument("--partition-bytes", type=int, default=0,
                   help="a scheduling strategy's partition (0: its default scaled with the model, as the grid)")
    p.add_argument("--credit", default="", help="a scheduling strategy's credit in bytes, or 'inf' (unlimited)")
    p.add_argument("--ss-interval", type=float, default=0.0, help="sample ss -tin in the sampled hosts (s; 0 = off)")
    p.add_argument("--congestion", default="cubic", help="emulated hosts' TCP congestion control ('inherit')")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every process of the job")
    p.add_argument("--out", default="docs/results/ps_key_timeline", help="prefix of the .png and .json written")
    p.add_argument("--title", default=None)
    # internal modes
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sample", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compute-scale", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--switch", help=argparse.SUPPRESS)
    p.add_argument("--hosts", nargs="*", default=[], help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--interval", type=float, default=0.005, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sample:
        return sample_main(args)
    if args.worker:
        return worker_main(args)

    from pushpull.bench.grid_spec import compute_scale_for, scaled_profile, scaled_ps_partition_bytes
    from pushpull.emulate import EmulatedCluster, launch_job
    from pushpull.sim.config import parse_bandwidth

    n = args.workers
    prof, size_scale, grad_bytes = scaled_profile(args.model, args.grad_mb)
    rate_Bps = parse_bandwidth(args.rate)
    compute_scale = compute_scale_for(prof, grad_bytes, rate_Bps, args.ratio)
    hosts = 2 * n if args.placement == "separate" else n
    server0_host = n if args.placement == "separate" else 0
    tmp = tempfile.mkdtemp(prefix="ps-key-timeline-")
    env = {"PUSHPULL_TRACE_ON": "1", "PUSHPULL_TRACE_DIR": f"{tmp}/trace",
           "PUSHPULL_TRACE_START_STEP": str(TRACE_STEP), "PUSHPULL_TRACE_END_STEP": str(TRACE_STEP),
           # BytePS's default key size scaled with the model, as the grid does
           "BYTEPS_PARTITION_BYTES": str(scaled_ps_partition_bytes(size_scale, n))}
    env.update(dict(kv.split("=", 1) for kv in args.env))
    with EmulatedCluster(hosts, rate=args.rate, congestion=None if args.congestion == "inherit" else args.congestion) as c:
        if not c.emulated:
            print("ps_key_timeline: network namespaces are unavailable here (needs root)", file=sys.stderr)
            return 2
        sampler = subprocess.Popen([sys.executable, __file__, "--sample", "--switch", c.switch_ns, "--hosts",
                                    c.ns(0), c.ns(server0_host), "--seconds", "90", "--result", f"{tmp}/samples.json",
                                    "--ss-interval", str(args.ss_interval)])
        base = args.strategy[:-3] if args.strategy.endswith("+lw") else args.strategy
        part = args.partition_bytes
        if not part and (args.credit or base == "bytescheduler"):  # the grid's scaled default partition
            from pushpull.bench.grid_spec import _scaled_scheduling

            part = _scaled_scheduling({"base": base, "partition_bytes": None, "credit_bytes": 1}, "ps",
                                      size_scale)["partition_bytes"]
        worker = [sys.executable, os.path.abspath(__file__), "--worker", "--model", args.model,
                  "--grad-mb", str(args.grad_mb), "--compute-scale", repr(compute_scale),
                  "--strategy", args.strategy, "--partition-bytes", str(part), "--credit", args.credit,
                  "--result", f"{tmp}/result.json"]
        nstat0 = {i: _nstat(c.ns(i)) for i in range(hosts)}
        job = launch_job(c, n, n, worker, env=env, placement=args.placement, log_dir=f"{tmp}/logs")
        job.wait(300)
        sampler.wait(120)
        qd = {i: c.qdisc_stats(i) for i in range(hosts)}
        nstat1 = {i: _nstat(c.ns(i)) for i in range(hosts)}
        sw = subprocess.run(["ip", "netns", "exec", c.switch_ns, "tc", "-s", "qdisc"], capture_output=True,
                            text=True).stdout
    res = json.loads(Path(f"{tmp}/result.json").read_text())
    samples = json.loads(Path(f"{tmp}/samples.json").read_text())
    s = analyse(tmp, res, samples, list(range(hosts)))
    bound = res["compute_s"] + res["bytes"] / rate_Bps
    ends = s["round_ends"]
    up_drops = [int(m) for i in range(hosts) for m in re.findall(r"dropped (\d+)", qd[i])[:1]]
    down_drops = [int(m) for m in re.findall(r"dev vb\d+ root.*?\n.*?dropped (\d+)", sw)]
    print(f"{args.model} {res['bytes'] / 1e6:.1f} MB, {n} workers, {n} servers ({args.placement}), {args.rate}, "
          f"{args.strategy}, env {args.env or 'defaults'}, congestion {args.congestion}")
    print(f"  traced step            {s['step_s'] * 1e3:7.0f} ms   bound c + M/B {bound * 1e3:.0f} ms "
          f"(c = {res['compute_s'] * 1e3:.0f} ms, M/B = {res['bytes'] / rate_Bps * 1e3:.0f} ms): "
          f"{s['step_s'] / bound:.2f}x the bound")
    if not ends:  # e.g. layer-wise updates (+lw): the trace counts steps at DistributedOptimizer.step()
        print("  no key traced in the traced step (layer-wise strategies are not traced per step yet)")
        return 1
    print(f"  keys traced            {len(s['keys'])}; rounds completed from {ends[0] * 1e3:.0f} to "
          f"{ends[-1] * 1e3:.0f} ms; median {statistics.median(ends) * 1e3:.0f} ms")
    spread = sorted(max(a.values()) - min(a.values()) for a in (d.get("arrivals", {}) for d in s["keys"])
                    if len(a) == n)
    if spread:
        print(f"  a round's pushes arrive spread over: median {statistics.median(spread) * 1e3:.0f} ms, "
              f"max {spread[-1] * 1e3:.0f} ms; worker 0's last push sent at "
              f"{(max(d['sent'] for d in s['keys']) - s['t_start']) * 1e3:.0f} ms, its last pull back at "
              f"{(max(d['resp'] for d in s['keys']) - s['t_start']) * 1e3:.0f} ms")
    idle = idle_fractions(samples, s["t_start"], s["t_start"] + s["step_s"], rate_Bps)
    for h, r in s["rates"].items():
        who = f"host {h}" + (" (worker 0)" if h == 0 else " (server 0)" if h == server0_host else "")
        print(f"  {who} link over the step: up {r['up'] * 8 / 1e6:6.1f} Mbit/s, down {r['down'] * 8 / 1e6:6.1f} "
              f"Mbit/s (link {rate_Bps * 8 / 1e6:.0f}); under 10 % of the link for {idle[h]['up'] * 100:.0f} % / "
              f"{idle[h]['down'] * 100:.0f} % of the step")
    for i in range(hosts):
        d = {k: nstat1[i].get(k, 0) - nstat0[i].get(k, 0) for k in NSTAT}
        print(f"  host {i} TCP over the job: " + ", ".join(f"{k.replace('TcpExt', '').replace('Tcp', '')} {v}"
                                                           for k, v in d.items()))
    print(f"  token-bucket drops over the job: uplinks {up_drops}, downlinks {down_drops}")
    title = args.title or (f"{args.model} {res['bytes'] / 1e6:.0f} MB, {n}+{n} hosts, {args.rate}, {args.strategy}; "
                           f"{' '.join(args.env) or 'defaults'}; {args.congestion}: step {s['step_s'] * 1e3:.0f} ms, "
                           f"bound {bound * 1e3:.0f} ms")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    plot(s, samples, [0, server0_host], rate_Bps, bound, title, f"{args.out}.png")
    Path(f"{args.out}.json").write_text(json.dumps({
        "args": vars(args), "step_s": s["step_s"], "bound_s": bound, "round_ends_s": ends,
        "rates_Bps": s["rates"], "uplink_drops": up_drops, "downlink_drops": down_drops,
        "keys": s["keys"], "t_start": s["t_start"]}, indent=None))
    print(f"  wrote {args.out}.png and {args.out}.json (raw samples in {tmp})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
