"""``pushpull bench latency``: the time of one tiny reduction (a metric, a loss
value, a 1-float gradient), push_pull against gloo's all_reduce in the same
processes, with raw round trips between the same two hosts as the bound.

Why a benchmark of its own: a model with hundreds of small tensors, or a loop
that averages a metric every step, pays this per call, and the bandwidth
benchmarks hide it. Every worker reduces one float ``--iters`` times back to
back (each call waits for the previous one), interleaved in blocks with gloo
so that both see the same machine load; push_pull runs three times per block:
on the caller's thread (the direct path a blocking small call takes by
default, over the server's direct lane where it offers one), the same over
ZeroMQ (as with PUSHPULL_DIRECT_LANE=0), and through the engine's I/O thread
(as with PUSHPULL_DIRECT_BYTES=0, and as every push_pull_async). Printed:
median and p99 of each, the ratio push_pull / gloo, and the median round trip
of one 4-byte message between ranks 0 and 1 over a raw socket of the lane's
kind (a Unix socket on loopback, else TCP) and over raw pyzmq: a push_pull is
at least one such round trip (worker -> server -> worker).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pushpull.cli import help_text
from pushpull.bench.jobs import join_gloo_beside, run_job


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class ZmqPing:
    """Rank 0 sends 4 bytes to rank 1, which sends them back; one round trip per call."""

    def __init__(self, rank: int, host: str):
        import zmq

        self.rank = rank
        self.ctx = zmq.Context()
        self.port = 0
        if rank == 1:
            self.sock = self.ctx.socket(zmq.ROUTER)
            self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock = self.ctx.socket(zmq.DEALER)
        self.host = host

    def connect(self, port: int) -> None:
        if self.rank == 0:
            self.sock.connect(f"tcp://{self.host}:{port}")

    def rounds(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            if self.rank == 1:
                if not self.sock.poll(60_000):
                    raise RuntimeError("zmq ping: rank 0 sent nothing for 60 s")
                self.sock.send_multipart(self.sock.recv_multipart())
            else:
                t0 = time.perf_counter()
                self.sock.send(b"ping")
                if not self.sock.poll(60_000):
                    raise RuntimeError("zmq ping: rank 1 did not answer within 60 s")
                self.sock.recv()
                out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        self.sock.close(linger=5_000)
        self.ctx.term()


class SockPing:
    """The same ping over a plain socket of the direct lane's kind (an abstract Unix socket on loopback,
    else TCP): the floor of a lane exchange."""

    def __init__(self, rank: int, host: str):
        import os
        import socket

        from pushpull.transport.security import is_loopback

        self.rank = rank
        self.unix = is_loopback(host) and sys.platform.startswith("linux")
        self.name = f"pushpull-bench-ping-{os.getpid()}-{os.urandom(6).hex()}"
        self.host = host
        self.sock = None
        self.port = 0
        if rank == 1:
            self.listener = socket.socket(socket.AF_UNIX if self.unix else socket.AF_INET, socket.SOCK_STREAM)
            self.listener.bind("\0" + self.name if self.unix else (host, 0))
            self.listener.listen(1)
            self.port = 0 if self.unix else self.listener.getsockname()[1]

    def address(self) -> str:
        return self.name if self.unix else str(self.port)

    def connect(self, address: str) -> None:
        import socket

        if self.rank == 0:
            if self.unix:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(60)
                self.sock.connect("\0" + address)
            else:
                self.sock = socket.create_connection((self.host, int(address)), timeout=60)
        else:
            self.listener.settimeout(60)
            self.sock, _ = self.listener.accept()
            self.sock.settimeout(60)
            self.listener.close()
        if not self.unix:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def rounds(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            if self.rank == 1:
                self.sock.sendall(self.sock.recv(4))
            else:
                t0 = time.perf_counter()
                self.sock.sendall(b"ping")
                self.sock.recv(4)
                out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        self.sock.close()


def child_main(args) -> int:
    import torch
    import torch.distributed as dist

    import pushpull.torch as bps

    bps.init()
    cfg = bps.config()
    ping = ZmqPing(bps.rank(), cfg.root_uri) if bps.rank() in (0, 1) else None
    sping = SockPing(bps.rank(), cfg.root_uri) if bps.rank() in (0, 1) else None
    port = join_gloo_beside(ping.port if ping else 0)
    if ping:
        ping.connect(port)
        # rank 1's socket address, sent to rank 0 over the zmq ping's socket (bound and connected now)
        if bps.rank() == 1:
            ident, msg = ping.sock.recv_multipart()
            ping.sock.send_multipart([ident, sping.address().encode()])
        else:
            ping.sock.send(b"address?")
            address = ping.sock.recv().decode()
        sping.connect(address if bps.rank() == 0 else "")
    rank, size = bps.rank(), bps.size()
    x = torch.ones(1)
    pp, pz, pe, ar, zp, sp = [], [], [], [], [], []
    eng = bps.engine()
    direct_cfg, engine_cfg = eng.cfg, eng.cfg.replace(direct_bytes=0)
    lanes = bool(eng.direct and eng.direct.lanes)
    direct_calls = 0
    block = max(1, args.iters // args.blocks)
    paths = [("direct", direct_cfg, True), ("engine", engine_cfg, True)]
    if lanes:
        paths.insert(1, ("direct_zmq", direct_cfg, False))
    for b in range(args.blocks + 1):  # block 0 warms up (declares the key, fills caches)
        runs = {}
        for path, cfg, use_lanes in paths:
            eng.cfg = cfg
            eng.direct.use_lanes = use_lanes
            bps.barrier()
            times = runs[path] = []
            before = eng.stats["direct_calls"]
            for _ in range(block):
                t0 = time.perf_counter()
                bps.push_pull(x, average=True, name="latency.x")
                times.append(time.perf_counter() - t0)
            if path == "direct" and b:
                direct_calls += eng.stats["direct_calls"] - before
        eng.cfg = direct_cfg
        eng.direct.use_lanes = True
        dist.barrier()
        gtimes = []
        for _ in range(block):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            gtimes.append(time.perf_counter() - t0)
        dist.barrier()
        ztimes = ping.rounds(block) if ping else []
        stimes = sping.rounds(block) if sping else []
        if b:
            pp += runs["direct"]
            pz += runs.get("direct_zmq", [])
            pe += runs["engine"]
            ar += gtimes
            zp += ztimes
            sp += stimes
    dist.barrier()
    if ping:
        ping.close()
        sping.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"pushpull_times": pp, "direct_zmq_times": pz, "engine_times": pe, "allreduce_times": ar,
                       "direct_calls": direct_calls, "zmq_times": zp,
                       "sock_times": sp, "lane": eng.direct.lanes.get("s0") if lanes else None,
                       "workers": size, "servers": cfg.num_server}, f)
    dist.destroy_process_group()
    bps.shutdown()
    return 0


def summarize(r: dict) -> dict:
    pp, ar, zp = r["pushpull_times"], r["allreduce_times"], r["zmq_times"]
    res = {"workers": r["workers"], "servers": r["servers"], "calls": len(pp),
           "pushpull_median_us": statistics.median(pp) * 1e6, "pushpull_p99_us": _pct(pp, 0.99) * 1e6,
           "allreduce_median_us": statistics.median(ar) * 1e6, "allreduce_p99_us": _pct(ar, 0.99) * 1e6,
           "zmq_roundtrip_median_us": statistics.median(zp) * 1e6 if zp else None}
    sp = r.get("sock_times") or []
    res["sock_roundtrip_median_us"] = statistics.median(sp) * 1e6 if sp else None
    pz = r.get("direct_zmq_times") or []
    if pz:
        res["direct_zmq_median_us"] = statistics.median(pz) * 1e6
        res["direct_zmq_p99_us"] = _pct(pz, 0.99) * 1e6
    res["lane"] = r.get("lane")
    pe = r.get("engine_times") or []
    if pe:
        res["engine_median_us"] = statistics.median(pe) * 1e6
        res["engine_p99_us"] = _pct(pe, 0.99) * 1e6
    res["direct_calls"] = r.get("direct_calls")
    res["ratio_vs_allreduce"] = res["pushpull_median_us"] / res["allreduce_median_us"]
    res["p99_over_median"] = res["pushpull_p99_us"] / res["pushpull_median_us"]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench latency", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--iters", type=int, default=2000, help="timed calls of each method")
    p.add_argument("--blocks", type=int, default=4, help="interleaved blocks the calls are split into")
    p.add_argument("--json", action="store_true", help="last line: one JSON object with the results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.workers < 2:
        p.error("--workers must be >= 2")
    r = run_job("pushpull bench latency", args.workers, args.servers,
                [sys.executable, "-m", "pushpull.bench.latency", "--child", "--iters", str(args.iters),
                 "--blocks", str(args.blocks)], timeout=600)
    if r is None:
        return 1
    res = summarize(r)
    print(f"one float, {res['workers']} workers, {res['servers']} server(s), {res['calls']} calls each")
    print(f"  push_pull (pushpull)   median {res['pushpull_median_us']:7.0f} us   p99 {res['pushpull_p99_us']:7.0f} us"
          + (f"   (direct path, over the {res['lane'].split(':')[0]} lane)" if res["lane"] else "   (direct path, ZeroMQ)"))
    if "direct_zmq_median_us" in res:
        print(f"  direct over ZeroMQ     median {res['direct_zmq_median_us']:7.0f} us   p99 "
              f"{res['direct_zmq_p99_us']:7.0f} us   (PUSHPULL_DIRECT_LANE=0)")
    if "engine_median_us" in res:
        print(f"  through the engine     median {res['engine_median_us']:7.0f} us   p99 {res['engine_p99_us']:7.0f} us"
              f"   (PUSHPULL_DIRECT_BYTES=0; the call above took the direct path {res['direct_calls']} times)")
    print(f"  all_reduce (gloo)      median {res['allreduce_median_us']:7.0f} us   p99 {res['allreduce_p99_us']:7.0f} us")
    print(f"  ratio pushpull / gloo  {res['ratio_vs_allreduce']:.2f}x   (pushpull p99 / median "
          f"{res['p99_over_median']:.2f})")
    if res["sock_roundtrip_median_us"] is not None:
        print(f"  raw socket round trip  median {res['sock_roundtrip_median_us']:7.0f} us (rank 0 <-> rank 1 over a "
              f"plain socket of the lane's kind: the floor of a lane exchange)")
    if res["zmq_roundtrip_median_us"] is not None:
        print(f"  raw pyzmq round trip   median {res['zmq_roundtrip_median_us']:7.0f} us (rank 0 <-> rank 1: "
              f"the floor of one worker -> server -> worker exchange)")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
