"""Measure what an emulated link really delivers: TCP throughput and RTT.

Used by ``pushpull cluster measure``, by the tests, and by benchmarks that want
to report the achieved (not the configured) bandwidth next to their results.
"""
from __future__ import annotations

import json
import subprocess
import sys

from pushpull.emulate.netns import EmulatedCluster, _terminate

PROBE = [sys.executable, "-m", "pushpull.emulate.tput"]


def _server(cluster: EmulatedCluster, host: int, argv: list[str], timeout: float) -> subprocess.Popen:
    p = cluster.popen(host, PROBE + argv + ["--timeout", str(timeout)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # "listening" (bounded by the probe's own accept timeout)
    if not line:
        _terminate(p)
        raise RuntimeError(f"probe server on host {host} did not start (rc={p.poll()})")
    return p


def _finish(p: subprocess.Popen, timeout: float) -> dict:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _terminate(p)
        raise RuntimeError("probe server did not finish in time") from None
    lines = [l for l in out.splitlines() if l.strip()]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"probe server failed (rc={p.returncode}): {out[-500:]}")
    return json.loads(lines[-1])


def throughput(cluster: EmulatedCluster, src: int = 0, dst: int = 1, seconds: float = 3.0,
               port: int = 5201) -> dict:
    """Timed one-way TCP transfer from host ``src`` to ``dst``; bits/s at the receiver."""
    timeout = seconds + 30
    if not cluster.emulated:
        port = _free_port()
    srv = _server(cluster, dst, ["sink", "--port", str(port)], timeout)
    try:
        cp = cluster.run(src, PROBE + ["send", "--host", cluster.addr(dst), "--port", str(port),
                                       "--seconds", str(seconds)], timeout=timeout)
        if cp.returncode != 0:
            raise RuntimeError(f"sender failed: {cp.stderr[-500:]}")
        return _finish(srv, timeout)
    finally:
        _terminate(srv)


def rtt(cluster: EmulatedCluster, a: int = 0, b: int = 1, count: int = 20, port: int = 5202) -> dict:
    """Median TCP round trip (1-byte ping-pong, Nagle off) from host ``a`` to ``b``."""
    timeout = 30.0
    if not cluster.emulated:
        port = _free_port()
    srv = _server(cluster, b, ["echo", "--port", str(port)], timeout)
    try:
        cp = cluster.run(a, PROBE + ["ping", "--host", cluster.addr(b), "--port", str(port),
                                     "--count", str(count)], timeout=timeout)
        if cp.returncode != 0:
            raise RuntimeError(f"ping failed: {cp.stderr[-500:]}")
        _finish(srv, timeout)
        return json.loads(cp.stdout.strip().splitlines()[-1])
    finally:
        _terminate(srv)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
