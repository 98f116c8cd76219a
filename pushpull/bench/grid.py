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
  ``auto`` (:mod:`pushpull.torch.executors.auto`: picks backend and strategy itself, starting over the
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
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pushpull.bench.grid_spec import cell_key, expand, load_config, restrict
from pushpull.cli import help_text


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
                        argv = [sys.executable, "-m", "pushpull.bench.grid_child", "--child", json.dumps(spec),
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
        from pushpull.bench.grid_child import main as child_main  # the entry point of older command lines

        return child_main(argv)
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
