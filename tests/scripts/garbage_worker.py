"""Sends malformed and unexpected messages straight to a live server, then checks
it still answers a normal push_pull (run under the launcher, 1 worker, forced)."""
import json
import sys

import torch
import zmq

import pushpull.torch as bps
from pushpull.cluster.nodes import worker_identity
from pushpull.transport.protocol import Header, MsgType, decode, dtype_code, pack_batch, unpack_batch

bps.init()
book = bps.engine().member.book
srv = book["servers"][0]
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.IDENTITY, worker_identity(0, "g"))  # rank 0's own second connection: past the identity check
auth = bps.engine().van.auth  # a member's garbage: with the job's credentials
if auth is not None:
    auth.connect(s, srv["host"])
s.connect(f"tcp://{srv['host']}:{srv['port']}")


def expect_error(parts, what):
    s.send_multipart(parts)
    if not s.poll(5000):
        print(f"FAIL: no answer to {what}")
        sys.exit(3)
    msg = decode(s.recv_multipart())
    if msg.header.type != MsgType.ERROR:
        print(f"FAIL: {what} answered {msg.header.type.name}")
        sys.exit(3)
    print(f"error for {what}: {json.loads(bytes(msg.body()))['error']}")


# undecodable: dropped and logged (no reply), must not crash
s.send_multipart([b"garbage"])
s.send_multipart([b""])
s.send_multipart([b"\x00" * 50])
expect_error([Header(MsgType.PUSH, sender=0, key=12345, round=1).pack(), b"1234"], "push to an unknown key")
expect_error([Header(MsgType.HEARTBEAT, sender=0).pack()], "a scheduler message sent to a server")
expect_error([Header(MsgType.INIT, sender=0, key=77, numel=4, dtype=dtype_code("float32")).pack(), b"{not json"],
             "INIT with bad JSON")
# batches: a truncated one and one nested in another are dropped whole; each message of a good
# one is handled (both errors come back, batched or not)
bad_pair = pack_batch([[Header(MsgType.PUSH, sender=0, key=4242, round=1).pack(), b"1234"],
                       [Header(MsgType.PULL, sender=0, key=4343, round=1).pack()]])
s.send_multipart([bad_pair[0], bad_pair[1][:-3]])
s.send_multipart(pack_batch([bad_pair]))
s.send_multipart(bad_pair)
answers = []
while len(answers) < 2 and s.poll(5000):
    msg = decode(s.recv_multipart())
    answers += unpack_batch(msg) if msg.header.type == MsgType.BATCH else [msg]
if sorted((m.header.type, m.header.key) for m in answers) != [(MsgType.ERROR, 4242), (MsgType.ERROR, 4343)]:
    print(f"FAIL: a batch of two bad requests answered {[(m.header.type.name, m.header.key) for m in answers]}")
    sys.exit(3)
print("batched errors:", [json.loads(bytes(m.body()))["error"] for m in answers])
# a valid tensor, then a push with the wrong length for it
x = bps.push_pull(torch.ones(8), name="t", average=False)
key = next(p.key for p in bps.engine().table.entries["allreduce.t"].parts)
expect_error([Header(MsgType.PUSH, sender=0, key=key, round=2, numel=8, dtype=dtype_code("float32")).pack(), b"123"],
             "push with the wrong length")
expect_error([Header(MsgType.PULL, sender=0, key=key, round=9).pack()], "pull of a round never pushed")
# the server is still alive and correct
for i in range(3):
    y = bps.push_pull(torch.full((8,), float(i)), name="t2", average=False)
    assert torch.equal(y, torch.full((8,), float(i))), y
s.close(0)
ctx.term()
bps.shutdown()
print("ALL-OK")
