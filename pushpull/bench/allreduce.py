"""``pushpull bench allreduce``: push_pull against torch.distributed all_reduce
(gloo) in the same processes on the same tensors, plus the raw pyzmq
round-trip rate as the transport ceiling.

Tensors: ResNet-50's gradients (25.6 M parameters in 161 tensors, from the
shipped profile). Each iteration reduces all of them, every tensor in flight
at once (push_pull_async / all_reduce(async_op=True)), then waits for all.

Ratios printed:
* ``ratio_vs_allreduce`` = all-reduce time / push_pull time (> 1: pushpull faster);
* ``fraction_of_zmq_ceiling`` = the aggregate rate at which push_pull moves
  bytes through sockets (every worker pushes M and pulls M bytes, 2·n·M in
  all) divided by the rate two processes reach bouncing large messages with
  raw pyzmq on the same machine (bytes sent both ways / time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20


def resnet50_sizes() -> list[int]:
    from pushpull.profiles import load_profile

    return [t.numel for t in load_profile("resnet50").tensors()]


# ---------------------------------------------------------------- zmq ceiling --

def _echo_server(addr: str, ready: threading.Event, stop: threading.Event) -> None:
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.ROUTER)
    s.bind(addr)
    ready.set()
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    while not stop.is_set():
        if poller.poll(100):
            parts = s.recv_multipart(copy=False)
            s.send_multipart(parts, copy=False)
    s.close(0)


def zmq_ceiling(total_bytes: int, chunk: int = 4 * MiB, window: int = 8) -> dict:
    """Bounce ``total_bytes`` through a second process in ``chunk``-sized messages."""
    import zmq

    from pushpull.launch.cli import free_port

    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys,threading;from pushpull.bench.allreduce import _echo_server;"
                              "r=threading.Event();s=threading.Event();_echo_server(sys.argv[1],r,s)", addr])
    try:
        ctx = zmq.Context()
        d = ctx.socket(zmq.DEALER)
        d.connect(addr)
        buf = bytearray(os.urandom(1024) * (chunk // 1024))
        n = max(1, total_bytes // chunk)

        def run() -> float:
            t0 = time.perf_counter()
            sent = recv = 0
            while recv < n:
                while sent < n and sent - recv < window:
                    d.send(buf, copy=False)
                    sent += 1
                if not d.poll(30_000):
                    raise RuntimeError("echo process did not answer within 30 s")
                d.recv(copy=False)
                recv += 1
            return time.perf_counter() - t0

        run()  # connect + warm up
        times = [run() for _ in range(3)]
        d.close(0)
        ctx.term()
    finally:
        child.kill()
        child.wait(5)
    t = statistics.median(times)
    return {"bytes_each_way": n * chunk, "seconds": t, "rate_Bps": 2 * n * chunk / t}


# ---------------------------------------------------------------- worker side --

def child_main(args) -> int:
    import torch
    import torch.distributed as dist

    import pushpull.torch as bps

    bps.init()
    rank, size = bps.rank(), bps.size()
    cfg = bps.config()
    os.environ.setdefault("MASTER_ADDR", cfg.root_uri)
    os.environ.setdefault("MASTER_PORT", str(cfg.root_port + 1))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=__import__("datetime").timedelta(seconds=120))
    sizes = resnet50_sizes()
    tensors = [torch.randn(n) for n in sizes]
    nbytes = sum(t.numel() * 4 for t in tensors)

    def pp_round() -> float:
        t0 = time.perf_counter()
        hs = [bps.push_pull_async(t, average=True, name=f"g{i}", priority=-i) for i, t in enumerate(tensors)]
        for h in hs:
            bps.synchronize(h)
        return time.perf_counter() - t0

    def ar_round() -> float:
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        return time.perf_counter() - t0

    pp_round()  # declares keys, warms up
    ar_round()
    pp, ar = [], []
    for _ in range(args.repeat):  # interleave so that both see the same machine load
        bps.barrier()
        pp.append(pp_round())
        dist.barrier()
        ar.append(ar_round())
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"pushpull_times": pp, "allreduce_times": ar, "bytes": nbytes, "tensors": len(tensors),
                       "workers": size, "servers": cfg.num_server}, f)
    dist.destroy_process_group()
    bps.shutdown()
    return 0


# ---------------------------------------------------------------- driver --

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench allreduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="timed iterations of each method")
    p.add_argument("--json", action="store_true", help="last line: one JSON object with the results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.workers < 2:
        p.error("--workers must be >= 2 (all-reduce of one worker is a no-op)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "pushpull", "launch", "--workers", str(args.workers), "--servers",
               str(args.servers), "--", sys.executable, "-m", "pushpull.bench.allreduce", "--child",
               "--repeat", str(args.repeat), "--out", out]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if res.returncode != 0 or not os.path.exists(out):
            print(res.stdout[-3000:], res.stderr[-3000:], sep="\n", file=sys.stderr)
            print("pushpull bench allreduce: the benchmark job failed", file=sys.stderr)
            return 1
        with open(out) as f:
            r = json.load(f)
    ceiling = zmq_ceiling(r["bytes"])
    pp = statistics.median(r["pushpull_times"])
    ar = statistics.median(r["allreduce_times"])
    pp_rate = 2 * r["workers"] * r["bytes"] / pp
    result = {
        "workers": r["workers"], "servers": r["servers"], "tensors": r["tensors"], "bytes": r["bytes"],
        "pushpull_s": pp, "allreduce_s": ar, "ratio_vs_allreduce": ar / pp,
        "pushpull_rate_GBps": pp_rate / 1e9, "zmq_ceiling_GBps": ceiling["rate_Bps"] / 1e9,
        "fraction_of_zmq_ceiling": pp_rate / ceiling["rate_Bps"],
        "pushpull_times": r["pushpull_times"], "allreduce_times": r["allreduce_times"],
    }
    print(f"ResNet-50 gradients: {r['tensors']} tensors, {r['bytes'] / MiB:.1f} MiB, "
          f"{r['workers']} workers, {r['servers']} servers, median of {args.repeat}")
    print(f"  push_pull (pushpull)      {pp * 1e3:8.1f} ms")
    print(f"  all_reduce (gloo)         {ar * 1e3:8.1f} ms")
    print(f"  ratio gloo / pushpull     {ar / pp:8.2f}x")
    print(f"  pushpull socket rate      {pp_rate / 1e9:8.2f} GB/s (2 x workers x bytes / time)")
    print(f"  raw pyzmq echo ceiling    {ceiling['rate_Bps'] / 1e9:8.2f} GB/s")
    print(f"  fraction of ceiling       {pp_rate / ceiling['rate_Bps']:8.2f}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
