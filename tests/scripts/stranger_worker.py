"""A process that reaches the job's ports without its secret (no credentials, or another job's)
sends what an attacker would: a registration to the scheduler, an INIT and a PUSH for a real key
to the server. It must get no reply at all, and the job's sums must stay exact.

Run under the launcher with 2 workers and 1 server; rank 0 plays the stranger between two rounds."""
import sys
import time

import torch
import zmq

import pushpull.torch as bps
from pushpull.transport.protocol import Header, MsgType, decode, dtype_code, encode_json, unpack_batch
from pushpull.transport.security import JobAuth

def server_rss_kb(port: int) -> int:
    """VmRSS of the server listening on ``port`` (found through /proc, as a test can)."""
    import os
    from pathlib import Path

    want = f":{port:04X} "
    inodes = {ln.split()[9] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:] if want in ln.split(None, 2)[1] + " "
              and ln.split()[3] == "0A"}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd).replace("socket:[", "").rstrip("]") in inodes:
                    status = (d / "status").read_text()
                    return int(status.split("VmRSS:")[1].split()[0])
        except OSError:
            continue
    raise RuntimeError(f"no process listens on port {port}")


def member_abuse(ctx, eng, srv, key, n) -> None:
    """What a member's socket (it has the job's credentials) can try: push as another rank, flood the
    server with declarations, send a frame larger than any key."""
    auth = eng.van.auth
    host, port = srv["host"], int(srv["port"])

    def sock(identity: bytes):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IDENTITY, identity)
        if auth is not None:
            auth.connect(s, host)
        s.connect(f"tcp://{host}:{port}")
        return s

    s = sock(b"w0.abuse")
    s.send_multipart([Header(MsgType.PUSH, sender=1, key=key, round=2, numel=8, nbytes=32,
                             dtype=dtype_code("float32"), flags=2).pack(), torch.full((8,), 1000.0).numpy().tobytes()])
    if not s.poll(5000):
        print("FAIL: a forged sender got no answer")
        sys.exit(3)
    h = decode(s.recv_multipart()).header
    print(f"forged sender answered {h.type.name}")
    rss0 = server_rss_kb(port)
    limit = bps.config().server_max_keys
    refused = 0
    for i in range(limit + 2000):
        s.send_multipart([Header(MsgType.INIT, sender=0, key=(1 << 40) + i, numel=1 << 20,
                                 dtype=dtype_code("float32")).pack(), encode_json({"name": f"flood{i}"})])
    deadline = time.monotonic() + 30
    while refused < 2000 and time.monotonic() < deadline and s.poll(2000):
        m = decode(s.recv_multipart())
        for m in (unpack_batch(m) if m.header.type == MsgType.BATCH else [m]):  # errors come batched
            refused += m.header.type == MsgType.ERROR and b"PUSHPULL_SERVER_MAX_KEYS" in bytes(m.body())
    print(f"key flood: {refused} of {limit + 2000} INITs refused beyond PUSHPULL_SERVER_MAX_KEYS={limit}")
    big = sock(b"w0.big")
    try:
        big.send_multipart([Header(MsgType.PUSH, sender=0, key=key, round=2).pack(),
                            bytes(bps.config().max_message_bytes + 1)], zmq.NOBLOCK)
    except zmq.Again:
        pass
    print(f"oversized frame answered: {bool(big.poll(3000))}")
    rss1 = server_rss_kb(port)
    print(f"server RSS {rss0} kB -> {rss1} kB after the flood and the oversized frame")
    s.close(0)
    big.close(0)


bps.init()
r, n = bps.rank(), bps.size()
eng = bps.engine()
y = bps.push_pull(torch.full((8,), float(r + 1)), name="t", average=False)
assert torch.equal(y, torch.full((8,), float(sum(range(1, n + 1))))), y
if r == 0:
    cfg = bps.config()
    srv = eng.member.book["servers"][0]
    key = eng.table.entries["allreduce.t"].parts[0].key
    ctx = zmq.Context()
    probes = []  # every stranger's socket and what it sent: all sent at once, then one second for any reply
    for creds in ("none", "another job's secret"):
        for host, port, parts, what in [
                (cfg.root_uri, cfg.root_port, [Header(MsgType.REGISTER).pack(),
                                               encode_json({"role": "worker", "rank": 1, "size": n})],
                 "REGISTER to the scheduler"),
                (srv["host"], srv["port"], [Header(MsgType.INIT, sender=1, key=key, numel=8,
                                                   dtype=dtype_code("float32")).pack(),
                                            encode_json({"name": "t", "compression": None})],
                 "INIT to the server"),
                (srv["host"], srv["port"], [Header(MsgType.PUSH, sender=1, key=key, round=2, numel=8, nbytes=32,
                                                   dtype=dtype_code("float32"), flags=2).pack(),
                                            torch.full((8,), 1000.0).numpy().tobytes()],
                 "PUSH of a real key as rank 1"),
                (None, srv.get("ipc"), [Header(MsgType.PUSH, sender=1, key=key, round=2, numel=8, nbytes=32,
                                               dtype=dtype_code("float32"), flags=2).pack(),
                                        torch.full((8,), 1000.0).numpy().tobytes()],
                 "PUSH on the server's local socket")]:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            if creds != "none":
                JobAuth("not this job's secret", cfg.auth).connect(s, host or srv["host"])
            s.connect(f"tcp://{host}:{port}" if host else port)  # no host: an ipc address (PUSHPULL_LOCAL_IPC)
            try:
                s.send_multipart(parts, zmq.NOBLOCK)
            except zmq.Again:
                pass  # no connection was ever accepted: nothing to send on
            probes.append((s, creds, what))
    time.sleep(1.0)
    for s, creds, what in probes:
        if s.poll(0):
            print(f"FAIL: stranger ({creds}) got a reply to {what}: {s.recv_multipart()!r}")
            sys.exit(3)
        print(f"no reply to a stranger ({creds}): {what}")
        s.close(0)
    print(f"worker 0 reaches server 0 at {eng.server_addrs['s0']} (the server offers {srv.get('ipc')})")
    # where the scheduler and the server listen: only the advertised loopback address, not 0.0.0.0
    ports = {cfg.root_port: "scheduler", int(srv["port"]): "server"}
    for line in open("/proc/net/tcp").read().splitlines()[1:] + open("/proc/net/tcp6").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.rsplit(":", 1)
        if state == "0A" and int(port, 16) in ports:  # LISTEN
            where = "127.0.0.1" if addr == "0100007F" else addr
            print(f"LISTEN {ports[int(port, 16)]} on {where}")
    member_abuse(ctx := zmq.Context(), eng, srv, key, n)
    ctx.term()
bps.barrier()
for i in range(3):  # the job still runs, and its sums are exact (no stranger's 1000.0 in them)
    y = bps.push_pull(torch.full((8,), float(r + 1 + i)), name="t", average=False)
    want = torch.full((8,), float(sum(k + 1 + i for k in range(n))))
    if not torch.equal(y, want):
        print(f"FAIL: round {i} summed {y.tolist()}, want {want.tolist()}")
        sys.exit(3)
bps.shutdown()
print("ALL-OK")
