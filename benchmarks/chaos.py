"""Chaos: an elastic job under random kills and stops of its workers, servers and scheduler (issue 30, item 4).

    flock /tmp/pushpull-cpu.lock python benchmarks/chaos.py [--minutes 10] [--every 30:60] [--seed 0]
        [--out docs/results/chaos.md]

One job, ``pushpull launch --workers 4 --servers 4 --min-workers 2 --restart-workers 99 --restart-servers 99
--restart-scheduler 99``,
trains the digits MLP with ``pushpull.torch.elastic.run`` (a commit per epoch, a 50 ms sleep per step standing in
for compute) for as long as ``--minutes`` says. Every 30-60 s (``--every``) this script picks a victim, each role
(worker, server, scheduler) at least ``--each`` times in a shuffled order, and sends it SIGKILL or SIGSTOP (one
of the two at random):

* a worker: the others restore their last commit and go on; the launcher starts a replacement, which comes in
  (a stopped one is found silent after PUSHPULL_HEARTBEAT_TIMEOUT=5, dropped, and ended by the launcher);
* a server: its partitions move to the others; the launcher starts a replacement, which takes its place and
  the partitions that had left it (a stopped one is dropped after the heartbeat timeout and ended);
* the scheduler: the nodes work on, the launcher starts a new one, and they register with it again.

Every step also sums an integer tensor (each rank's rank + 1) and checks the exact sum for the job's size; a
wrong one is printed (this script counts those lines, which no restore takes back), a right one adds 1 to a
counter kept in the model (restored with it). At the end the page gives: whether the job finished, that
counter against the steps the final model's epochs hold at the sizes they ran at (a step lost, applied twice
or summed wrong shows there), the wrong sums, the held-out accuracy against an
undisturbed run of the same job (run first, for as long as the chaos lasts), and per kind of failure the
recovery: how long the workers waited (a step over 1 s, summed over the waits the failure caused, a
replacement's coming in included), and when a lost worker's replacement was in or a new scheduler had taken
the job over.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_SLEEP_S = 0.05
STALL_WINDOW_S = 20.0  # a stall that begins this long after a failure is still that failure's
BATCH = 32


def steps_per_epoch(size: int, samples: int = 1437) -> int:
    """The steps an epoch holds at ``size`` workers (each takes its 1/size of the 1437 training digits)."""
    return math.ceil(math.ceil(samples / size) / BATCH)


# ------------------------------------------------------------------ the worker --
def worker(args) -> None:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import pushpull.torch as bps

    torch.set_num_threads(1)
    bps.init()
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.int64)
    tr, te = train_test_split(range(len(y)), test_size=0.2, random_state=0, stratify=y.numpy())
    x_tr, y_tr, x_te, y_te = x[tr], y[tr], x[te], y[te]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    # the steps applied to the model, counted in the model (restored with it): +1 per step whose server sum
    # was exact, so a step applied twice, lost, or summed wrong shows against what the epochs hold
    model.register_buffer("ticks", torch.zeros((), dtype=torch.int64))
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = bps.elastic.TorchState(model, opt, epoch=0, epoch_sizes=[])
    deadline = time.time() + args.seconds if args.seconds else None
    clock = {"last": time.time()}  # the last step's end, across restores (a restore's wait is a stall too)

    @bps.elastic.run
    def train(state) -> None:
        while state.epoch < args.epochs:
            rank, size = bps.rank(), bps.size()
            g = torch.Generator().manual_seed(1000 * state.epoch)
            idx = torch.randperm(len(y_tr), generator=g)[rank::size]
            steps = steps_per_epoch(size, len(y_tr))
            for s in range(steps):
                b = idx[s * BATCH:(s + 1) * BATCH]
                opt.zero_grad()
                F.cross_entropy(model(x_tr[b]), y_tr[b]).backward()
                opt.step()
                got = bps.push_pull(torch.full((4,), rank + 1, dtype=torch.int64), average=False, name="chaos.sum")
                if torch.equal(got, torch.full((4,), size * (size + 1) // 2, dtype=torch.int64)):
                    model.ticks += 1
                else:  # counted by the harness from the output: a restore cannot take it back
                    print(f"WRONG rank {rank} of {size}: {got.tolist()}", flush=True)
                now = time.time()
                if now - clock["last"] > 1.0:  # a step that waited: when the wait began and ended (wall clock)
                    print(f"STALL rank {rank} {clock['last']:.3f} {now:.3f}", flush=True)
                clock["last"] = now
                time.sleep(STEP_SLEEP_S)
            state.epoch_sizes = state.epoch_sizes + [size]
            state.epoch += 1
            state.commit()
            if deadline is not None and state.epoch >= 3:  # the undisturbed run: as many epochs as fit its time
                late = bps.push_pull(torch.tensor([float(time.time() > deadline)]), average=False, name="chaos.end")
                if float(late[0]) > 0:  # one worker past it is enough, and every worker sees the same sum
                    args.epochs = state.epoch

    train(state)
    model.eval()
    with torch.no_grad():
        acc = float((model(x_te).argmax(1) == y_te).float().mean())
    if bps.rank() == 0:
        print("RESULT " + json.dumps({"epochs": state.epoch, "applied": int(model.ticks), "accuracy": acc,
                                      "size": bps.size(), "epoch_sizes": state.epoch_sizes}), flush=True)
    bps.shutdown()


# ------------------------------------------------------------------ the harness --
def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _role(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
    if state in ("Z", "T", "t"):  # exited, or stopped by us already
        return None
    if "pushpull.launch.role scheduler" in cmd:
        return "scheduler"
    if "pushpull.launch.role server" in cmd:
        return "server"
    if "chaos.py" in cmd and "--worker" in cmd:
        return "worker"
    return None


def run_job(args, epochs: int, seconds: float, chaos: list | None) -> dict:
    """One job; ``chaos``: [(role, signal)] to send in order, every ``args.every`` seconds."""
    cmd = [sys.executable, "-m", "pushpull", "launch", "--workers", str(args.workers), "--servers",
           str(args.servers), "--min-workers", "2", "--restart-workers", "99", "--restart-servers", "99",
           "--restart-scheduler", "99",
           "--env", "PUSHPULL_HEARTBEAT_TIMEOUT=5", "--env", "PUSHPULL_TIMEOUT=60", "--env", "OMP_NUM_THREADS=1",
           "--", sys.executable, str(Path(__file__).resolve()), "--worker", "--epochs", str(epochs),
           "--seconds", str(seconds)]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, text=True)
    lines: list[tuple[float, str]] = []

    def read():
        for ln in proc.stdout:
            lines.append((time.time(), ln.rstrip("\n")))
            if args.verbose:
                print(ln, end="", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    events = []
    rng = random.Random(args.seed + 1)
    lo, hi = args.every
    for role, sig in chaos or []:
        wait_until = time.time() + rng.uniform(lo, hi)
        while time.time() < wait_until and proc.poll() is None:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
        pids = [p for p in _children(proc.pid) if _role(p) == role]
        if not pids:
            events.append({"t": time.time(), "role": role, "signal": sig, "pid": None, "skipped": "none running"})
            continue
        pid = rng.choice(pids)
        try:
            os.kill(pid, getattr(signal, sig))
        except ProcessLookupError:
            continue
        events.append({"t": time.time(), "role": role, "signal": sig, "pid": pid})
        print(f"chaos: {sig} {role} pid {pid} at +{time.time() - t0:.0f}s", flush=True)
    try:
        proc.wait(timeout=args.job_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(5)
    out = "\n".join(ln for _, ln in lines)
    res = re.search(r"RESULT (\{.*\})", out)
    result = json.loads(res.group(1)) if res else None
    if result is not None:  # what the epochs hold, from the sizes they ran at; wrong sums from every rank's lines
        result["due"] = sum(steps_per_epoch(s) for s in result["epoch_sizes"])
        result["wrong"] = len(re.findall(r"WRONG rank", out))
    return {"rc": proc.returncode, "result": result, "events": events,
            "lines": lines, "wall": time.time() - t0, "t0": t0}


def recovery(job: dict) -> list[dict]:
    """Per event: until every worker present completed a step again (the end of the last stall that began
    before the signal, or within a few seconds after it), and for a worker until its replacement came in."""
    stalls = []
    for _, ln in job["lines"]:
        m = re.search(r"STALL rank \d+ ([\d.]+) ([\d.]+)", ln)
        if m:
            stalls.append((float(m.group(1)), float(m.group(2))))
    joins = [t for t, ln in job["lines"] if "worker joined the running job as rank" in ln]
    takeovers = [t for t, ln in job["lines"] if "took the running job over" in ln]
    servers_back = [t for t, ln in job["lines"] if "a replacement server (pid" in ln]
    out = []
    for i, e in enumerate(job["events"]):
        if e.get("pid") is None:
            continue
        t, nxt = e["t"], (job["events"][i + 1]["t"] if i + 1 < len(job["events"]) else float("inf"))
        # the stalls it caused: begun (the last step before the wait ended) from just before it until just before
        # the next one or STALL_WINDOW_S after it (a replacement's coming in); the time the workers waited, summed
        # over those stalls (the longest rank's, as the ranks wait together)
        mine = [(max(a, t), b) for a, b in stalls if t - 1.0 <= a < min(nxt - 1.0, t + STALL_WINDOW_S)]
        by_start: dict = {}
        for a, b in mine:  # one stall per wait, as every rank reports it: the longest
            key = round(a)
            by_start[key] = max(by_start.get(key, 0.0), b - a)
        stall = sum(by_start.values())
        extra = {}
        if e["role"] == "worker":
            j = [x for x in joins if t < x < nxt]
            extra["replacement_in_s"] = (j[0] - t) if j else None
        if e["role"] == "server":
            k = [x for x in servers_back if t < x < nxt]
            extra["replacement_in_s"] = (k[0] - t) if k else None
        if e["role"] == "scheduler":
            k = [x for x in takeovers if t < x < nxt]
            extra["takeover_s"] = (k[0] - t) if k else None
        out.append({**e, "stall_s": max(0.0, stall), **extra})
    return out


def schedule(args) -> list[tuple[str, str]]:
    rng = random.Random(args.seed)
    roles = ["worker"] * args.each + ["server"] * args.each + ["scheduler"] * args.each
    rng.shuffle(roles)
    return [(r, rng.choice(["SIGKILL", "SIGSTOP"])) for r in roles]


def report(args, control: dict, runs: list[tuple[dict, list]]) -> str:
    lines = ["# Chaos: an elastic job under random kills and stops", "",
             f"`flock /tmp/pushpull-cpu.lock python benchmarks/chaos.py --minutes {args.minutes:g} --every "
             f"{args.every[0]:g}:{args.every[1]:g} --each {args.each} --runs {args.runs} --seed {args.seed} "
             f"--workers {args.workers} --servers {args.servers}"
             + (f" --no-control {args.no_control}" if args.no_control else "") + "`: "
             f"{args.workers} workers, {args.servers} servers, `--min-workers 2 --restart-workers 99 "
             f"--restart-servers 99 --restart-scheduler 99`, PUSHPULL_HEARTBEAT_TIMEOUT=5; the digits MLP under "
             f"`elastic.run` (a "
             f"commit per epoch, {STEP_SLEEP_S * 1000:.0f} ms of sleep per step for compute). A failure every "
             f"{args.every[0]:g}-{args.every[1]:g} s: each role at least {args.each} times, SIGKILL or SIGSTOP "
             f"at random; every lost process is replaced.", "",
             (f"Undisturbed run: {control['result']['epochs']} epochs, held-out accuracy "
              f"{control['result']['accuracy']:.4f}, {control['wall']:.0f} s." if control["result"]["accuracy"] is not None
              else f"No undisturbed run (--no-control): {control['result']['epochs']} epochs, accuracy floor 0.95."),
             ""]
    all_rows = []
    for n, (job, rows) in enumerate(runs, 1):
        r = job["result"] or {}
        ok = passed(job, control)
        want = control["result"]["accuracy"]
        if r:
            floor = f"undisturbed {want:.4f}" if want is not None else "floor 0.95"
            summary = (f"epochs {r['epochs']}, steps applied to the final model {r['applied']} (its epochs hold "
                       f"{r['due']}), wrong sums {r['wrong']}, held-out accuracy {r['accuracy']:.4f} ({floor}), "
                       f"workers at the end {r['size']}, {job['wall']:.0f} s")
        else:
            summary = "no result"
        lines += [f"## Run {n}: {'passed' if ok else 'FAILED'}", "", f"exit {job['rc']}; {summary}",
                  "", "| + s | role | signal | workers waited (summed) | replacement in / takeover after |",
                  "|---:|---|---|---:|---:|"]
        t0 = job["t0"]
        for e in rows:
            other = e.get("replacement_in_s", e.get("takeover_s"))
            lines.append(f"| {e['t'] - t0:.0f} | {e['role']} | {e['signal']} | {e['stall_s']:.1f} s | "
                         + ("never" if other is None else f"{other:.1f} s") + " |")
        lines.append("")
        all_rows += rows
    lines += ["## Recovery per kind of failure (all runs)", "",
              "| kind | events | waited: median | waited: worst | replacement / takeover: median | worst |",
              "|---|---:|---:|---:|---:|---:|"]
    for role in ("worker", "server", "scheduler"):
        for sig in ("SIGKILL", "SIGSTOP"):
            rows = [e for e in all_rows if e["role"] == role and e["signal"] == sig]
            if not rows:
                continue
            st = [e["stall_s"] for e in rows]
            oth = [v for e in rows for v in [e.get("replacement_in_s", e.get("takeover_s"))] if v is not None]
            lines.append(f"| {role} {sig} | {len(rows)} | {statistics.median(st):.1f} s | {max(st):.1f} s | "
                         + (f"{statistics.median(oth):.1f} s | {max(oth):.1f} s |" if oth else " | |"))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="how long the chaos lasts (the job a little longer)")
    p.add_argument("--every", default="30:60", help="seconds between failures, lo:hi")
    p.add_argument("--each", type=int, default=3, help="failures of each role at least")
    p.add_argument("--runs", type=int, default=1, help="chaos runs after the undisturbed one")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="relay the job's output")
    p.add_argument("--no-control", type=int, default=0, metavar="EPOCHS",
                   help="skip the undisturbed run: train this many epochs and hold the accuracy to 0.95 (CI)")
    p.add_argument("--out", default=None, help="the results page (markdown, and .json beside it)")
    p.add_argument("--logs", default=None, help="where a failed run's whole log goes (default: the temp folder)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=10 ** 6, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    args.every = tuple(float(v) for v in args.every.split(":"))
    planned = args.each * 3
    seconds = max(args.minutes * 60, planned * args.every[1]) + args.every[1]
    args.job_timeout = seconds * 3 + 120
    if args.no_control:
        control = {"rc": 0, "wall": 0.0, "result": {"epochs": args.no_control, "accuracy": None}}
    else:  # as many epochs as fit: the chaos runs train as many
        control = run_job(args, 10 ** 6, seconds, None)
    if control["rc"] != 0 or not control["result"]:
        print("\n".join(ln for _, ln in control["lines"][-60:]))
        raise SystemExit("the undisturbed run failed")
    epochs = control["result"]["epochs"]
    print(f"undisturbed: {epochs} epochs, accuracy {control['result']['accuracy']}, {control['wall']:.0f} s",
          flush=True)
    runs = []
    seed = args.seed
    for n in range(args.runs):
        plan = schedule(argparse.Namespace(**{**vars(args), "seed": seed + n}))
        job = run_job(args, epochs, 0.0, plan)
        rows = recovery(job)
        runs.append((job, rows))
        r = job["result"]
        print(f"run {n + 1}: exit {job['rc']}, {r}", flush=True)
        if not passed(job, control):  # the whole log, for the cause: a failure's start is often minutes back
            log = Path(args.logs or tempfile.gettempdir()) / f"pushpull-chaos-run{n + 1}-{os.getpid()}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("\n".join(f"{t - job['t0']:9.3f} {ln}" for t, ln in job["lines"]) + "\n")
            print("\n".join(ln for _, ln in job["lines"][-40:]))
            print(f"run {n + 1} failed: its whole log (seconds since its start on each line) is in {log}", flush=True)
    text = report(args, control, runs)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            {"control": control["result"], "runs": [{"rc": j["rc"], "result": j["result"], "events": rows}
                                                    for j, rows in runs]}, indent=1))
    return 0 if all(passed(j, control) for j, _ in runs) else 1


def passed(job: dict, control: dict) -> bool:
    """Finished, every step of its epochs applied once, every sum exact, the accuracy within a point of the
    undisturbed run's (or at least 0.95 without one)."""
    r, want = job["result"], control["result"]["accuracy"]
    return bool(job["rc"] == 0 and r and r["applied"] == r["due"] and r["wrong"] == 0
                and (r["accuracy"] >= 0.95 if want is None else abs(r["accuracy"] - want) <= 0.01))


if __name__ == "__main__":
    sys.exit(main())
