"""Plain-socket throughput and RTT probes, run inside the emulated hosts.

Kept free of numpy/torch so a probe process starts in a fraction of a second.
The receiver measures: bytes received between its first and last byte, so the
connection set-up and the sender's buffering do not count.

    python -m pushpull.emulate.tput sink --port 5201           # prints JSON, exits
    python -m pushpull.emulate.tput send --host A --port 5201 --seconds 3
    python -m pushpull.emulate.tput echo --port 5202           # RTT server
    python -m pushpull.emulate.tput ping --host A --port 5202 --count 20
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time

CHUNK = 256 * 1024


def _listen(port: int, timeout: float) -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(timeout)
    print(json.dumps({"listening": port}), flush=True)
    return srv


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sink(port: int, timeout: float = 30.0) -> dict:
    srv = _listen(port, timeout)
    conn, _ = srv.accept()
    conn.settimeout(timeout)
    buf = bytearray(CHUNK)
    n = 0
    t_first = t_last = None
    while True:
        k = conn.recv_into(buf)
        if not k:
            break
        t_last = time.perf_counter()
        if t_first is None:
            t_first = t_last
            k0 = k  # the first chunk arrives at t_first; do not count it
        n += k
    conn.close()
    srv.close()
    if t_first is None or t_last <= t_first:
        return {"bytes": n, "seconds": 0.0, "bits_per_s": 0.0}
    secs = t_last - t_first
    return {"bytes": n, "seconds": secs, "bits_per_s": (n - k0) * 8 / secs}


def send(host: str, port: int, seconds: float, timeout: float = 30.0) -> dict:
    s = _connect(host, port, timeout)
    s.settimeout(timeout)
    payload = b"\0" * CHUNK
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s.sendall(payload)
        n += CHUNK
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # wait for the receiver to close: all bytes delivered
    s.close()
    return {"bytes": n, "seconds": time.perf_counter() - t0}


def echo(port: int, timeout: float = 30.0) -> dict:
    srv = _listen(port, timeout)
    conn, _ = srv.accept()
    conn.settimeout(timeout)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = 0
    while True:
        d = conn.recv(64)
        if not d:
            break
        conn.sendall(d)
        n += 1
    conn.close()
    srv.close()
    return {"echoed": n}


def ping(host: str, port: int, count: int = 20, timeout: float = 30.0) -> dict:
    s = _connect(host, port, timeout)
    s.settimeout(timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(count + 2):
        t = time.perf_counter()
        s.sendall(b"x")
        if not s.recv(64):
            break
        rtts.append(time.perf_counter() - t)
    s.close()
    rtts = rtts[2:]  # the first round trips pay for slow start / ARP
    return {"rtt_median_s": statistics.median(rtts), "rtt_min_s": min(rtts), "count": len(rtts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pushpull.emulate.tput")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("sink", "echo"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--timeout", type=float, default=30.0)
    p = sub.add_parser("send")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=30.0)
    p = sub.add_parser("ping")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    if a.cmd == "sink":
        r = sink(a.port, a.timeout)
    elif a.cmd == "echo":
        r = echo(a.port, a.timeout)
    elif a.cmd == "send":
        r = send(a.host, a.port, a.seconds, a.timeout)
    else:
        r = ping(a.host, a.port, a.count, a.timeout)
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
