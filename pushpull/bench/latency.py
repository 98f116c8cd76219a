"""``pushpull bench latency``: the time of one tiny reduction (a metric, a loss
value, a 1-float gradient), push_pull against gloo's all_reduce in the same
processes, with raw round trips between the same two hosts as the bound.

Why a benchmark of its own: a model with hundreds of small tensors, or a loop
that averages a metric every step, pays this per call, and the bandwidth
benchmarks hide it. Every worker reduces one float ``--iters`` times back to
back (each call waits for the previous one), interleaved in blocks with gloo
so that both see the same machine load (each method's block starts after a
barrier with one untimed call: the ranks leave a barrier up to a round trip
apart, and the first call would time that skew, 2.5-4x a call's median on the
2-core VM, not the reduction); push_pull runs three times per block:
on the caller's thread (the direct path a blocking small call takes by
default, over the server's direct lane where it offers one), the same over
ZeroMQ (as with PUSHPULL_DIRECT_LANE=0), and through the engine's I/O thread
(as with PUSHPULL_DIRECT_BYTES=0, and as every push_pull_async). Printed:
median and p99 of each, the ratio push_pull / gloo, and the median round trip
of one 4-byte message between ranks 0 and 1 over a raw socket of the lane's
kind (a Unix socket on loopback, else TCP) and over raw pyzmq: a push_pull is
at least one such round trip (worker -> server -> worker).

The bound of a push_pull's shape: ranks 0 and 1 each send one float to a
third process (a relay of a few lines started by rank 0: no pushpull code,
plain sockets of the lane's kind), which sums them and answers both, first the
one that sent first. That is a direct-lane round with nothing of the library
in it, so its median and its p99 / median say what three processes on this
machine get with almost no work per round; gloo's all_reduce is the peer (two
processes, no third). Every figure is printed with its p99 and p99 / median.
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
            self.sock = _dial(self.unix, self.host, address)
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


def _dial(unix: bool, host: str, address: str):
    """A connected stream socket to ``address``: an abstract Unix socket's name, or a TCP port on ``host``
    (60 s timeout either way)."""
    import socket

    if unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect("\0" + address)
        return sock
    return socket.create_connection((host, int(address)), timeout=60)


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data


def relay_main(fd: int) -> int:
    """The relay process of :class:`RelayPing`: accept ranks 0 and 1 on the listening socket ``fd`` (each
    says its rank in one byte), then per round read one float from each, in the order they arrive, and
    answer the sum to both, the first sender first. Ends when a client closes."""
    import select
    import socket
    import struct

    listener = socket.socket(fileno=fd)
    listener.settimeout(60)
    clients = {}
    while len(clients) < 2:
        c, _ = listener.accept()
        c.settimeout(60)
        clients[_recv_exact(c, 1)[0]] = c
    listener.close()
    socks = [clients[0], clients[1]]
    f32 = struct.Struct("<f")
    try:
        while True:
            order = []
            while len(order) < 2:  # whichever pushed first is read (and answered) first, as the server does
                ready, _, _ = select.select([c for c in socks if c not in order], [], [], 60)
                if not ready:
                    raise TimeoutError("relay: no float from a client within 60 s")
                order.extend(ready)
            total = f32.pack(sum(f32.unpack(_recv_exact(c, 4))[0] for c in order))
            for c in order:
                c.sendall(total)
    except ConnectionError:
        return 0
    finally:
        for c in socks:
            c.close()


class RelayPing:
    """Ranks 0 and 1 each send one float to a relay process that sums them and answers both: the shape of a
    push_pull over the direct lane (two workers, a third process), without pushpull. Rank 0 starts the relay
    (on its listening socket, passed down) and times the rounds."""

    def __init__(self, rank: int, host: str):
        import os
        import socket
        import subprocess

        from pushpull.transport.security import is_loopback

        self.rank = rank
        self.host = host
        self.unix = is_loopback(host) and sys.platform.startswith("linux")
        self.sock = None
        self.proc = None
        self.name = ""
        if rank == 0:
            listener = socket.socket(socket.AF_UNIX if self.unix else socket.AF_INET, socket.SOCK_STREAM)
            if self.unix:
                self.name = f"pushpull-bench-relay-{os.getpid()}-{os.urandom(6).hex()}"
                listener.bind("\0" + self.name)
            else:
                listener.bind((host, 0))
                self.name = str(listener.getsockname()[1])
            listener.listen(2)
            self.proc = subprocess.Popen([sys.executable, "-m", "pushpull.bench.latency", "--relay",
                                          str(listener.fileno())], pass_fds=[listener.fileno()])
            listener.close()

    def address(self) -> str:
        return self.name

    def connect(self, address: str) -> None:
        import socket

        self.sock = _dial(self.unix, self.host, address)
        if not self.unix:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(bytes([self.rank]))

    def rounds(self, n: int) -> list[float]:
        out = []
        one = b"\x00\x00\x80\x3f"  # 1.0 as a little-endian float32
        for _ in range(n):
            t0 = time.perf_counter()
            self.sock.sendall(one)
            _recv_exact(self.sock, 4)
            out.append(time.perf_counter() - t0)
        return out if self.rank == 0 else []

    def close(self) -> None:
        self.sock.close()
        if self.proc is not None:
            import subprocess

            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def child_main(args) -> int:
    import torch
    import torch.distributed as dist

    import pushpull.torch as bps

    bps.init()
    cfg = bps.config()
    ping = ZmqPing(bps.rank(), cfg.root_uri) if bps.rank() in (0, 1) else None
    sping = SockPing(bps.rank(), cfg.root_uri) if bps.rank() in (0, 1) else None
    relay = RelayPing(bps.rank(), cfg.root_uri) if bps.rank() in (0, 1) else None
    port = join_gloo_beside(ping.port if ping else 0)
    if ping:
        ping.connect(port)
        # rank 0's relay address to rank 1 and rank 1's socket address to rank 0, over the zmq ping's socket
        # (bound and connected now)
        if bps.rank() == 1:
            ident, relay_address = ping.sock.recv_multipart()
            ping.sock.send_multipart([ident, sping.address().encode()])
            relay.connect(relay_address.decode())
        else:
            ping.sock.send(relay.address().encode())
            address = ping.sock.recv().decode()
            relay.connect(relay.address())
        sping.connect(address if bps.rank() == 0 else "")
    rank, size = bps.rank(), bps.size()
    x = torch.ones(1)
    pp, pz, pe, ar, zp, sp, rp = [], [], [], [], [], [], []
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
            bps.push_pull(x, average=True, name="latency.x")  # untimed: absorbs the barrier's release skew
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
        dist.all_reduce(x)  # untimed, as above
        gtimes = []
        for _ in range(block):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            gtimes.append(time.perf_counter() - t0)
        dist.barrier()
        # each bound's first round after the barrier is dropped too
        ztimes = ping.rounds(block + 1)[1:] if ping else []
        stimes = sping.rounds(block + 1)[1:] if sping else []
        rtimes = relay.rounds(block + 1)[1:] if relay else []
        if b:
            pp += runs["direct"]
            pz += runs.get("direct_zmq", [])
            pe += runs["engine"]
            ar += gtimes
            zp += ztimes
            sp += stimes
            rp += rtimes
    dist.barrier()
    if ping:
        ping.close()
        sping.close()
        relay.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"pushpull_times": pp, "direct_zmq_times": pz, "engine_times": pe, "allreduce_times": ar,
                       "direct_calls": direct_calls, "zmq_times": zp,
                       "sock_times": sp, "relay_times": rp, "lane": eng.direct.lanes.get("s0") if lanes else None,
                       "workers": size, "servers": cfg.num_server}, f)
    dist.destroy_process_group()
    bps.shutdown()
    return 0


def summarize(r: dict) -> dict:
    pp, ar = r["pushpull_times"], r["allreduce_times"]
    res = {"workers": r["workers"], "servers": r["servers"], "calls": len(pp),
           "pushpull_median_us": statistics.median(pp) * 1e6, "pushpull_p99_us": _pct(pp, 0.99) * 1e6,
           "allreduce_median_us": statistics.median(ar) * 1e6, "allreduce_p99_us": _pct(ar, 0.99) * 1e6}
    res["allreduce_p99_over_median"] = res["allreduce_p99_us"] / res["allreduce_median_us"]
    for name, key in (("zmq_roundtrip", "zmq_times"), ("sock_roundtrip", "sock_times"), ("relay", "relay_times")):
        xs = r.get(key) or []
        res[f"{name}_median_us"] = statistics.median(xs) * 1e6 if xs else None
        res[f"{name}_p99_us"] = _pct(xs, 0.99) * 1e6 if xs else None
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
    p.add_argument("--relay", type=int, help=argparse.SUPPRESS)  # the relay process (its listening socket's fd)
    args = p.parse_args(argv)
    if args.relay is not None:
        return relay_main(args.relay)
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

    def line(label: str, med: float, p99: float, note: str = "") -> None:
        print(f"  {label:22s} median {med:7.0f} us   p99 {p99:7.0f} us   p99/median {p99 / med:5.2f}{note}")

    print(f"one float, {res['workers']} workers, {res['servers']} server(s), {res['calls']} calls each")
    line("push_pull (pushpull)", res["pushpull_median_us"], res["pushpull_p99_us"],
         f"   (direct path, over the {res['lane'].split(':')[0]} lane)" if res["lane"] else "   (direct path, ZeroMQ)")
    if "direct_zmq_median_us" in res:
        line("direct over ZeroMQ", res["direct_zmq_median_us"], res["direct_zmq_p99_us"], "   (PUSHPULL_DIRECT_LANE=0)")
    if "engine_median_us" in res:
        line("through the engine", res["engine_median_us"], res["engine_p99_us"],
             f"   (PUSHPULL_DIRECT_BYTES=0; the call above took the direct path {res['direct_calls']} times)")
    line("all_reduce (gloo)", res["allreduce_median_us"], res["allreduce_p99_us"], "   (the peer)")
    print(f"  ratio pushpull / gloo  {res['ratio_vs_allreduce']:.2f}x   (pushpull p99 / median "
          f"{res['p99_over_median']:.2f}; gloo's {res['allreduce_p99_over_median']:.2f})")
    if res["relay_median_us"] is not None:
        line("relay of 3 processes", res["relay_median_us"], res["relay_p99_us"],
             "   (bound: ranks 0 and 1 -> a relay summing -> both, plain sockets of the lane's kind, no pushpull)")
    if res["sock_roundtrip_median_us"] is not None:
        line("raw socket round trip", res["sock_roundtrip_median_us"], res["sock_roundtrip_p99_us"],
             "   (rank 0 <-> rank 1 over a plain socket of the lane's kind: the floor of a lane exchange)")
    if res["zmq_roundtrip_median_us"] is not None:
        line("raw pyzmq round trip", res["zmq_roundtrip_median_us"], res["zmq_roundtrip_p99_us"],
             "   (rank 0 <-> rank 1: the floor of one exchange over ZeroMQ)")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
