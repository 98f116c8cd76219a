"""The worker's side of a sparse table: which server owns which rows, and the messages to them.

A table of ``rows`` rows is split into contiguous row ranges, one per server (server j holds
``[j * rows // k, (j + 1) * rows // k)``, as ps-lite splits its key range), so every worker routes a
row to the same server without asking anyone. Each step moves only the rows a batch touched:
SPARSE_PUSH carries their ids (int64) and gradients (float32) to their servers, SPARSE_PULL asks for
the rows the next batch needs, answered once the servers applied the round.

The exchanges run on the caller's thread over sockets of their own (:class:`DirectPath`'s, one per
thread, authenticated like every connection): a lookup blocks anyway until its rows are there, and a
push is sent without waiting; its acknowledgement (or the server's error) is read before the next
pull on the same connection. Every wait is bounded by PUSHPULL_TIMEOUT and checks the cluster's
liveness.
"""
from __future__ import annotations

import hashlib
import time
from types import SimpleNamespace

import numpy as np
import zmq

from pushpull.transport.protocol import (
    Flags, Header, MsgType, ProtocolError, decode, decode_json, dtype_code, encode_json, f32_bits, unpack_batch,
)
from pushpull.worker.direct import LIVENESS_S, DirectPath
from pushpull.worker.handle import PushPullError

FLOAT32 = dtype_code("float32")


def table_key(name: str) -> int:
    """The table's key on every server: a hash of its name (sparse tables have a key space of their own,
    and a collision of two names is caught by the servers' declaration check)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def row_bounds(rows: int, servers: int) -> list[int]:
    """Server j owns rows [bounds[j], bounds[j + 1])."""
    return [j * rows // servers for j in range(servers + 1)]


class SparseClient:
    """One sparse table as seen from one worker (created by :class:`pushpull.torch.SparseEmbedding`)."""

    def __init__(self, engine, name: str, rows: int, dim: int, optimizer: dict):
        if not engine.started or not engine.num_servers:
            raise PushPullError(f"sparse table {name!r} needs parameter servers (pushpull.torch.init() with "
                                f"servers, PUSHPULL_BACKEND=ps)")
        self.engine = engine
        self.name, self.rows, self.dim = name, int(rows), int(dim)
        self.key = table_key(name)
        self.servers = engine.num_servers
        self.bounds = row_bounds(self.rows, self.servers)
        self.path = DirectPath(engine.van.ctx, engine.rank, dict(engine.direct.servers), auth=engine.van.auth)
        engine.closers.append(self.path.close)
        self.error: str | None = None  # a server refused a request: every later call raises it
        self.round = 0  # rounds this worker pushed
        self.unacked = [0] * self.servers  # pushes whose acknowledgement was not read yet, per server
        self.stats = {"bytes_pushed": 0, "bytes_pulled": 0, "rows_pushed": 0, "rows_pulled": 0}
        # messages per server hold at most this many rows (half the largest message a server accepts)
        self.chunk_rows = max(1, (engine.cfg.max_message_bytes // 2) // (8 + 4 * self.dim))
        body = {"name": name, "rows": self.rows, "dim": self.dim, "optimizer": optimizer}
        for j in range(self.servers):
            decl = encode_json({**body, "lo": self.bounds[j], "hi": self.bounds[j + 1]})
            self._send(j, Header(MsgType.SPARSE_INIT, key=self.key), [decl])
        for j in range(self.servers):
            self._recv(j, MsgType.SPARSE_ACK, None, "its declaration (SPARSE_INIT)")

    # ------------------------------------------------------------------ wire --
    def _send(self, server: int, header: Header, frames: list) -> None:
        if self.error is not None:
            raise PushPullError(self.error)
        header.sender = self.engine.rank
        header.gen = self.engine.gen
        s = self.path._socket(f"s{server}")
        if frames:
            s.send(header.pack(), zmq.SNDMORE)
            for i, f in enumerate(frames):
                s.send(f, zmq.SNDMORE if i < len(frames) - 1 else 0, copy=memoryview(f).nbytes < 65536)
        else:
            s.send(header.pack())

    def _recv(self, server: int, want: MsgType, rnd: int | None, what: str):
        """Read answers from ``server`` until the ``want`` answer (of round ``rnd``) for this table; counts
        push acknowledgements on the way and raises the server's error for this table."""
        s = self.path._socket(f"s{server}")
        deadline = time.monotonic() + self.engine.cfg.timeout
        while True:
            if s.poll(int(LIVENESS_S * 1000)) == 0:
                failure = self.engine.member.failure
                if failure:
                    raise PushPullError(f"sparse table {self.name!r}: {failure}")
                if time.monotonic() > deadline:
                    ask = SimpleNamespace(sock=f"s{server}", key=self.key)
                    missing = self.engine.status.missing_ranks(None, [ask], rnd or 0)
                    raise PushPullError(
                        f"sparse table {self.name!r}: server {server} did not answer {what} within "
                        f"{self.engine.cfg.timeout:.0f}s (PUSHPULL_TIMEOUT): {missing} (a round completes when "
                        f"every worker pushed it: does every worker call step() once per step?)")
                continue
            try:
                msg = decode(s.recv_multipart(copy=False))
                msgs = unpack_batch(msg) if msg.header.type is MsgType.BATCH else (msg,)
            except ProtocolError:
                continue
            for m in msgs:
                h = m.header
                if h.key != self.key:
                    continue
                if h.type == MsgType.ERROR:  # answers still in flight could be misread later: the table is done
                    self.error = str(decode_json(m.body()).get("error", "unknown server error"))
                    raise PushPullError(self.error)
                if h.type == MsgType.SPARSE_ACK and h.round:  # a push's (an INIT's has round 0)
                    self.unacked[server] = max(0, self.unacked[server] - 1)
                    if want == MsgType.SPARSE_ACK:
                        return m
                    continue
                if h.type == want and (rnd is None or h.round == rnd):
                    return m

    def _split(self, ids: np.ndarray) -> list[tuple[int, slice]]:
        """(server, slice of ``ids``) for sorted ``ids``; ids outside the table go to the first or the last
        server, which refuses them naming the row."""
        cuts = np.searchsorted(ids, self.bounds[1:-1], side="left")
        edges = [0, *cuts.tolist(), len(ids)]
        return [(j, slice(edges[j], edges[j + 1])) for j in range(self.servers)]

    # ------------------------------------------------------------------ API --
    def pull(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (sorted, unique, int64) after the last round this worker pushed, as (len, dim)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        asked = []
        for j, sl in self._split(ids):
            for lo in range(sl.start, sl.stop, self.chunk_rows):
                hi = min(sl.stop, lo + self.chunk_rows)
                self._send(j, Header(MsgType.SPARSE_PULL, key=self.key, round=self.round, numel=hi - lo,
                                     dtype=dtype_code("int64"), nbytes=8 * (hi - lo)), [ids[lo:hi]])
                asked.append((j, lo, hi))
                self.stats["bytes_pushed"] += 8 * (hi - lo)
        for j, lo, hi in asked:  # answers come in the order asked, per server
            m = self._recv(j, MsgType.SPARSE_ROWS, self.round, f"the pull of round {self.round}")
            buf = m.body_view()
            if len(buf) != 4 * (hi - lo) * self.dim:
                raise PushPullError(f"sparse table {self.name!r}: server {j} answered {len(buf)} bytes for "
                                    f"{hi - lo} rows of {self.dim} float32")
            out[lo:hi] = np.frombuffer(buf, dtype="<f4").reshape(hi - lo, self.dim)
            self.stats["bytes_pulled"] += len(buf)
        self.stats["rows_pulled"] += len(ids)
        return out

    def push(self, ids: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """This worker's gradients of rows ``ids`` (sorted, unique) for the next round; every server gets a
        push (an empty one where no row is its), since a round completes with every worker's push."""
        self.round += 1
        self._rows(ids, grads, Header(MsgType.SPARSE_PUSH, key=self.key, round=self.round, extra=f32_bits(lr)),
                   chunked=False)

    def load(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Write rows (rank 0 loading the table's start); returns once every server stored them."""
        self._rows(ids, values, Header(MsgType.SPARSE_PUSH, key=self.key, flags=Flags.SET), chunked=True)
        self.flush()

    def _rows(self, ids: np.ndarray, vals: np.ndarray, proto: Header, chunked: bool) -> None:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        vals = np.ascontiguousarray(vals, dtype=np.float32).reshape(len(ids), self.dim)
        for j, sl in self._split(ids):
            n = sl.stop - sl.start
            if not chunked and n > self.chunk_rows:
                raise PushPullError(f"sparse table {self.name!r}: {n} rows for server {j} in one step, more than a "
                                    f"message holds ({self.chunk_rows} rows; PUSHPULL_MAX_MESSAGE_BYTES)")
            step = self.chunk_rows if chunked else max(n, 1)
            for lo in range(sl.start, max(sl.stop, sl.start + 1), step):
                hi = min(sl.stop, lo + step)
                h = Header(proto.type, key=proto.key, round=proto.round if not chunked else 1, flags=proto.flags,
                           extra=proto.extra, dtype=FLOAT32, numel=hi - lo, nbytes=4 * (hi - lo) * self.dim)
                self._send(j, h, [ids[lo:hi], vals[lo:hi]])
                self.unacked[j] += 1
                self.stats["bytes_pushed"] += 8 * (hi - lo) + 4 * (hi - lo) * self.dim
        self.stats["rows_pushed"] += len(ids)

    def flush(self) -> None:
        """Wait for every push's acknowledgement (the server's error, if any, is raised here)."""
        for j in range(self.servers):
            while self.unacked[j]:
                self._recv(j, MsgType.SPARSE_ACK, None, "a push's acknowledgement")
