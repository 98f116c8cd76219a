"""Asynchronous training's store keys (the servers' copy of the parameters) under attack: rank 0 sends a
delta push to a real store key from a socket without the job's secret, with another job's secret, and with
the job's credentials but an identity that is no worker's or that claims another rank. None may change the
parameters: afterwards every worker's parameters are exactly rank 0's start minus every member's deltas.

Run under the launcher with 2 workers and 1 server."""
import sys

import torch
import zmq

import pushpull.torch as bps
from pushpull.transport.protocol import Flags, Header, MsgType, decode, dtype_code
from pushpull.transport.security import JobAuth

bps.init()
r, n = bps.rank(), bps.size()
model = torch.nn.Linear(4, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(10.0)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                               named_parameters=model.named_parameters(), asynchronous=True)
print(f"rank {r} optimizer {type(opt).__mro__[0].__name__} async={hasattr(opt, '_keys')}", flush=True)


def step() -> None:
    opt.zero_grad()
    model.weight.sum().backward()  # gradient 1 everywhere: each step's delta is -1 (lr 1)
    opt.step()


step()
bps.barrier()
if r == 0:
    eng = bps.engine()
    cfg = bps.config()
    part = eng.table.entries["async.weight"].parts[0]
    srv = eng.member.book["servers"][part.server]
    host, port = srv["host"], int(srv["port"])
    ctx = zmq.Context()
    delta = torch.full((4,), 1000.0).numpy().tobytes()
    for what, creds, identity, sender in [("no credentials", None, None, 1),
                                          ("another job's secret", "not this job's secret", None, 1),
                                          ("the job's credentials, no worker's identity", "job", b"rogue", 0),
                                          ("the job's credentials, rank 0's connection claiming rank 1", "job",
                                           b"w0.forged", 1)]:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            s.setsockopt(zmq.IDENTITY, identity)
        if creds == "job":
            if eng.van.auth is not None:
                eng.van.auth.connect(s, host)
        elif creds is not None:
            JobAuth(creds, cfg.auth).connect(s, host)
        s.connect(f"tcp://{host}:{port}")
        try:
            s.send_multipart([Header(MsgType.PUSH, sender=sender, key=part.key, round=1, numel=4, nbytes=16,
                                     dtype=dtype_code("float32"), flags=Flags.PULL, gen=eng.gen).pack(), delta],
                             zmq.NOBLOCK)
        except zmq.Again:
            pass  # never connected: nothing sent
        answer = decode(s.recv_multipart()).header.type.name if s.poll(2000) else "nothing"
        print(f"stranger push ({what}): answered {answer}", flush=True)
        s.close(0)
    ctx.term()
bps.barrier()
for _ in range(2):
    step()
bps.barrier()
opt._pull_all()
want = 10.0 - 3 * n  # rank 0's start, minus three steps of -1 on each of the n members
got = model.weight.detach()
if not torch.equal(got, torch.full_like(got, want)):
    print(f"FAIL: rank {r} parameters {got.tolist()}, want {want}", flush=True)
    sys.exit(3)
print(f"rank {r} parameters exact after the strangers' pushes: {want}", flush=True)
bps.shutdown()
print("ALL-OK", flush=True)
