"""SparseEmbedding checks, one per mode (argv[1]); prints ALL-OK or FAIL: ... and exits non-zero.

equiv:    the same model trained with a dense nn.Embedding (DistributedOptimizer, SGD) and with a
          SparseEmbedding on the servers: same loss every step, same table at the end.
boundary: a table of 11 rows on 2 servers: rows [0, 5) on server 0, [5, 11) on server 1.
oob:      a lookup of a row past the table is refused by the server, naming the table and the row.
limit:    a table larger than PUSHPULL_SPARSE_MAX_TABLE_BYTES is refused at its declaration.
silent:   rank 1 never steps: rank 0's lookup times out naming rank 1 (PUSHPULL_TIMEOUT=4).
join:     rank 1 joins (join()): rank 0's next lookup fails saying so instead of waiting for a round.
"""
import sys

import numpy as np
import torch

import pushpull.torch as bps
from pushpull.transport.protocol import Header, MsgType
from pushpull.worker.sparse import SparseClient


def fail(text: str) -> None:
    print(f"FAIL: rank {bps.rank()}: {text}", flush=True)
    bps.shutdown()
    sys.exit(3)


def equiv() -> None:
    rows, dim, steps, lr = 50, 8, 12, 0.5
    torch.manual_seed(0)  # the same start on every worker (rank 0's is loaded into the sparse table)
    start = torch.randn(rows, dim)
    target = torch.randn(dim)
    dense = torch.nn.Embedding(rows, dim)
    with torch.no_grad():
        dense.weight.copy_(start)
    opt = bps.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=lr),
                                   named_parameters=[("dense.weight", dense.weight)])
    sparse = bps.SparseEmbedding(rows, dim, name="equiv.table", lr=lr, weight=start)
    gen = torch.Generator().manual_seed(100 + bps.rank())  # each worker its own batches, repeated ids too
    for step in range(steps):
        ids = torch.randint(0, rows, (4, 6), generator=gen)
        y = torch.randn(4, 6, generator=gen)
        losses = []
        for emb in (dense, sparse):
            out = emb(ids)
            loss = (((out * target).sum(-1) - y) ** 2).mean()
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        sparse.step()
        if abs(losses[0] - losses[1]) > 1e-5 * max(1.0, abs(losses[0])):
            fail(f"step {step}: dense loss {losses[0]!r}, sparse loss {losses[1]!r}")
        print(f"step {step}: loss dense {losses[0]:.6f} sparse {losses[1]:.6f}", flush=True)
    table = sparse.table()
    err = (table - dense.weight.detach()).abs().max().item()
    if err > 1e-5:
        fail(f"tables differ by {err} after {steps} steps")
    if torch.equal(table, start):
        fail("the table did not move")
    print(f"max |dense - sparse| after {steps} steps: {err:.2e}", flush=True)


def boundary() -> None:
    rows, dim = 11, 3
    start = torch.arange(rows, dtype=torch.float32).repeat_interleave(dim).reshape(rows, dim)
    emb = bps.SparseEmbedding(rows, dim, name="boundary.table", weight=start)
    if emb.client.bounds != [0, 5, 11]:
        fail(f"row ranges {emb.client.bounds}, expected [0, 5, 11]")
    got = emb(torch.tensor([5, 4, 10, 0]))
    if not torch.equal(got[:, 0], torch.tensor([5.0, 4.0, 10.0, 0.0])):
        fail(f"rows 5, 4, 10, 0 read as {got[:, 0].tolist()}")
    for server, row, holds in ((0, 5, "[0, 5)"), (1, 4, "[5, 11)")):  # each server holds its range only
        # a second client of the same table (a refusal makes a client unusable), asking one server directly
        c = SparseClient(bps.engine(), "boundary.table", rows, dim, {"name": "sgd"})
        c.declare()  # the table exists: the servers acknowledge this worker's declaration alone
        c._send(server, Header(MsgType.SPARSE_PULL, key=c.key, round=0, numel=1), [np.array([row], np.int64)])
        try:
            c._recv(server, MsgType.SPARSE_ROWS, 0, "a pull")
        except bps.PushPullError as e:
            if f"row {row}, not on this server (it holds rows {holds})" not in str(e):
                fail(f"server {server} refused row {row} with: {e}")
        else:
            fail(f"server {server} answered row {row}, which is not in its range {holds}")
    emb.step()


def oob() -> None:
    emb = bps.SparseEmbedding(20, 4, name="oob.table")
    try:
        emb(torch.tensor([3, 20]))
    except bps.PushPullError as e:
        if "sparse table 'oob.table'" not in str(e) or "row 20, out of range [0, 20)" not in str(e):
            fail(f"wrong error: {e}")
        print(f"refused: {e}", flush=True)
    else:
        fail("row 20 of a 20-row table was answered")


def limit() -> None:
    try:
        bps.SparseEmbedding(100_000, 64, name="big.table")  # 12.8 MB per server, the limit is 1 MB
    except bps.PushPullError as e:
        if "sparse table 'big.table'" not in str(e) or "PUSHPULL_SPARSE_MAX_TABLE_BYTES=1000000" not in str(e):
            fail(f"wrong error: {e}")
        print(f"refused: {e}", flush=True)
    else:
        fail("a 25.6 MB table was accepted with PUSHPULL_SPARSE_MAX_TABLE_BYTES=1000000")


def join() -> None:
    import time

    emb = bps.SparseEmbedding(8, 2, name="join.table")
    if bps.rank() == 1:
        bps.join()
        return
    deadline = time.monotonic() + 30
    while True:  # lookups of round 0 are answered until the servers hear of the join
        try:
            emb(torch.tensor([1, 6]))
        except bps.PushPullError as e:
            if "sparse table 'join.table': rank 1 joined" not in str(e):
                fail(f"wrong error: {e}")
            print(f"refused: {e}", flush=True)
            break
        if time.monotonic() > deadline:
            fail("lookups still answered 30 s after rank 1 joined")
        time.sleep(0.05)
    bps.join()


def silent() -> None:
    import time

    emb = bps.SparseEmbedding(8, 2, name="silent.table")
    if bps.rank() == 1:
        time.sleep(6)  # never steps; rank 0 waits at the barrier for ~2 s after its lookup timed out
        return
    emb(torch.tensor([1, 6])).sum().backward()
    emb.step()
    try:
        emb(torch.tensor([2]))
    except bps.PushPullError as e:
        if "rank(s) [1] have not pushed round 1 of it yet" not in str(e):
            fail(f"wrong error: {e}")
        print(f"refused: {e}", flush=True)
    else:
        fail("the lookup of round 1 was answered without rank 1's push")


bps.init()
{"silent": silent, "join": join, "equiv": equiv, "boundary": boundary, "oob": oob, "limit": limit}[sys.argv[1]]()
if sys.argv[1] != "join":  # after a join the job's rounds start again; nothing else to wait for
    bps.barrier()
print("ALL-OK", flush=True)
bps.shutdown()
