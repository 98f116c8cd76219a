"""A process that reaches the job's ports without its secret (no credentials, or another job's)
sends what an attacker would: a registration to the scheduler, an INIT and a PUSH for a real key
to the server. It must get no reply at all, and the job's sums must stay exact.

Run under the launcher with 2 workers and 1 server; rank 0 plays the stranger between two rounds."""
import sys

import torch
import zmq

import pushpull.torch as bps
from pushpull.transport.protocol import Header, MsgType, dtype_code, encode_json
from pushpull.transport.security import JobAuth

bps.init()
r, n = bps.rank(), bps.size()
eng = bps.engine()
y = bps.push_pull(torch.full((8,), float(r + 1)), name="t", average=False)
assert torch.equal(y, torch.full((8,), float(sum(range(1, n + 1))))), y
if r == 0:
    cfg = bps.config()
    srv = eng.member.book["servers"][0]
    key = eng.entries["t"].parts[0].key
    ctx = zmq.Context()
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
                 "PUSH of a real key as rank 1")]:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            if creds != "none":
                JobAuth("not this job's secret", cfg.auth).connect(s, host)
            s.connect(f"tcp://{host}:{port}")
            try:
                s.send_multipart(parts, zmq.NOBLOCK)
            except zmq.Again:
                pass  # no connection was ever accepted: nothing to send on
            if s.poll(2000):
                print(f"FAIL: stranger ({creds}) got a reply to {what}: {s.recv_multipart()!r}")
                sys.exit(3)
            print(f"no reply to a stranger ({creds}): {what}")
            s.close(0)
    ctx.term()
    # where the scheduler and the server listen: only the advertised loopback address, not 0.0.0.0
    ports = {cfg.root_port: "scheduler", int(srv["port"]): "server"}
    for line in open("/proc/net/tcp").read().splitlines()[1:] + open("/proc/net/tcp6").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.rsplit(":", 1)
        if state == "0A" and int(port, 16) in ports:  # LISTEN
            where = "127.0.0.1" if addr == "0100007F" else addr
            print(f"LISTEN {ports[int(port, 16)]} on {where}")
bps.barrier()
for i in range(3):  # the job still runs, and its sums are exact (no stranger's 1000.0 in them)
    y = bps.push_pull(torch.full((8,), float(r + 1 + i)), name="t", average=False)
    want = torch.full((8,), float(sum(k + 1 + i for k in range(n))))
    if not torch.equal(y, want):
        print(f"FAIL: round {i} summed {y.tolist()}, want {want.tolist()}")
        sys.exit(3)
bps.shutdown()
print("ALL-OK")
