"""Run one benchmark as a local pushpull job and read back its JSON result.

The benchmarks measure inside a real job (scheduler, servers, workers as
separate processes); the driver only starts it and reads the one JSON file
rank 0 writes, so a failure shows the job's own output instead of a
traceback from the driver.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def run_job(prog: str, workers: int, servers: int, child: list[str], timeout: float,
            env: dict[str, str] | None = None) -> dict | None:
    """Launch ``child`` (given ``--out FILE`` appended) under ``pushpull launch``; its JSON, or
    None after printing why (the job's output tail, or the timeout) to stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
        for k, v in (env or {}).items():
            cmd += ["--env", f"{k}={v}"]
        cmd += ["--", *child, "--out", out]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"{prog}: no result within {timeout:.0f}s", file=sys.stderr)
            return None
        if res.returncode != 0 or not os.path.exists(out):
            print(res.stdout[-4000:], res.stderr[-4000:], sep="\n", file=sys.stderr)
            print(f"{prog}: the benchmark job failed", file=sys.stderr)
            return None
        with open(out) as f:
            return json.load(f)


def join_gloo_beside(peer_port: int = 0) -> int:
    """Inside a benchmark job (after ``pushpull.torch.init()``): join a gloo process group of the same ranks
    and share rank 1's ``peer_port`` (a socket it has bound for a raw-pyzmq floor) with every rank through
    push_pull; returns that port. Rank 0 picks the rendezvous port; the peer socket is bound before its port
    is published, so no other process can take it meanwhile."""
    import datetime

    import torch
    import torch.distributed as dist

    import pushpull.torch as bps
    from pushpull.launch.cli import free_port

    rank, cfg = bps.rank(), bps.config()
    ports = torch.zeros(2, dtype=torch.int64)
    if rank == 0:
        ports[0] = free_port()
    if rank == 1:
        ports[1] = peer_port
    ports = bps.push_pull(ports, average=False, name="bench.ports")
    os.environ.setdefault("MASTER_ADDR", cfg.root_uri)
    os.environ.setdefault("MASTER_PORT", str(int(ports[0])))
    dist.init_process_group("gloo", rank=rank, world_size=bps.size(), timeout=datetime.timedelta(seconds=120))
    return int(ports[1])
