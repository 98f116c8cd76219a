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

In an elastic job the table is declared per generation of the job: a change of the workers or of the
servers makes every call raise :class:`WorkersChanged`, the servers drop the table, and
:meth:`SparseClient.redeclare` lays it out again over the servers alive (a lost server's range goes to the
others), to be loaded from the workers' copies (pushpull.torch.SparseEmbedding).
"""
from __future__ import annotations

import hashlib
import time
from types import SimpleNamespace

import numpy as np
import zmq

from pushpull.transport.protocol import (
    COPY_CLOSE, COPY_OPEN, COPY_READ, Flags, Header, MsgType, decode_json, dtype_code, encode_json, f32_bits,
    frame_view, messages,
)
from pushpull.worker.direct import LIVENESS_S, DirectPath
from pushpull.worker.handle import PushPullError, WorkersChanged

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
        self.optimizer = dict(optimizer)
        self.key = table_key(name)
        self.stats = {"bytes_pushed": 0, "bytes_pulled": 0, "rows_pushed": 0, "rows_pulled": 0}
        # messages per server hold at most this many rows (half the largest message a server accepts); the
        # elastic copies' messages carry ids, rows and Adagrad's accumulators
        self.chunk_rows = max(1, (engine.cfg.max_message_bytes // 2) // (8 + 4 * self.dim))
        self.copy_chunk_rows = max(1, (engine.cfg.max_message_bytes // 2) // (8 + 8 * self.dim))
        self.elastic = bool(engine.cfg.min_workers)
        self.path = None
        self.stream: CopyStream | None = None  # a commit's copy being read (its answers are taken on any read)
        self.gen = -1  # the job's generation the table was declared in (-1: not declared)
        self.noticed = -1  # the last generation a call was told of (WorkersChanged)

    def declare(self, gen: int | None = None) -> None:
        """Declare the table to the servers alive (collective: a server creates it once every worker did), its
        rows split among them; a new generation of the job calls it again (:meth:`redeclare`). ``gen``: the
        generation the caller agreed with the others in; a later one raises WorkersChanged (the others are not
        declaring in it)."""
        engine = self.engine
        if gen is not None and engine.gen != gen:
            raise WorkersChanged(f"sparse table {self.name!r}: the job changed again while it was being restored "
                                 f"({engine.changed_reason})")
        self.gen = engine.gen
        lost = engine.servers_lost
        self.owners = [j for j in range(engine.num_servers) if j not in lost]  # the servers holding a range
        if not self.owners:
            raise PushPullError(f"sparse table {self.name!r}: no server is alive")
        self.servers = len(self.owners)
        self.bounds = row_bounds(self.rows, self.servers)
        self.stream = None
        self.path = DirectPath(engine.van.ctx, engine.first_rank, dict(engine.direct.servers), auth=engine.van.auth)
        engine.closers.append(self.path.close)
        self.error: str | None = None  # a server refused a request: every later call raises it
        self.round = 0  # rounds this worker pushed
        self.unacked = [0] * self.servers  # pushes whose acknowledgement was not read yet, per range
        body = {"name": self.name, "rows": self.rows, "dim": self.dim, "optimizer": self.optimizer,
                "elastic": self.elastic}
        for j in range(self.servers):
            decl = encode_json({**body, "lo": self.bounds[j], "hi": self.bounds[j + 1]})
            self._send(j, Header(MsgType.SPARSE_INIT, key=self.key), [decl])
        for j in range(self.servers):
            self._recv(j, MsgType.SPARSE_ACK, None, "its declaration (SPARSE_INIT)")

    def redeclare(self, gen: int) -> None:
        """The job changed: the servers dropped the table; declare it again over the servers alive in generation
        ``gen`` (new sockets: answers to the old generation's requests never reach the new ones)."""
        if self.path is not None:
            self.path.close()
            if self.path.close in self.engine.closers:
                self.engine.closers.remove(self.path.close)
            self.path = None
        self.declare(gen)

    def check_generation(self) -> None:
        """A change of the job since the declaration: the table is gone from the servers until it is declared
        again and loaded (elastic.run does it, from the workers' copies)."""
        gen = self.engine.gen
        if gen == self.gen:
            return
        if not self.elastic:  # the end of a join() (the only change outside elastic jobs)
            raise PushPullError(f"sparse table {self.name!r}: the job changed ({self.engine.changed_reason}); "
                                f"sparse tables do not support join()")
        if self.noticed == gen:  # told once already, and nobody loaded it again: a retry would loop forever
            raise PushPullError(f"sparse table {self.name!r} was not loaded again after the job changed (generation "
                                f"{gen}): put its module in the model of the elastic.TorchState that "
                                f"pushpull.torch.elastic.run restores, which loads it from the workers' copies")
        self.noticed = gen
        self.engine.changed_unseen = False  # this is the caller's notice of the change
        raise WorkersChanged(f"sparse table {self.name!r}: {self.engine.changed_reason or 'the job changed'}; "
                             f"the servers dropped it, and elastic.run loads it again from the workers' copies of "
                             f"the last commit")

    # ------------------------------------------------------------------ wire --
    def _send(self, server: int, header: Header, frames: list) -> None:
        """``server``: the index of a range (``self.owners[server]`` is the server holding it)."""
        if self.error is not None:
            raise PushPullError(self.error)
        self.check_generation()
        header.sender = self.engine.rank
        header.gen = self.gen
        s = self.path._socket(f"s{self.owners[server]}")
        if frames:
            s.send(header.pack(), zmq.SNDMORE)
            for i, f in enumerate(frames):
                s.send(f, zmq.SNDMORE if i < len(frames) - 1 else 0, copy=memoryview(f).nbytes < 65536)
        else:
            s.send(header.pack())

    def _recv(self, server: int, want: MsgType, rnd: int | None, what: str):
        """Read answers from ``server`` until the ``want`` answer (of round ``rnd``) for this table; counts
        push acknowledgements on the way and raises the server's error for this table."""
        s = self.path._socket(f"s{self.owners[server]}")
        deadline = time.monotonic() + self.engine.cfg.timeout
        while True:
            if s.poll(int(LIVENESS_S * 1000)) == 0:
                failure = self.engine.member.failure
                if failure:
                    raise PushPullError(f"sparse table {self.name!r}: {failure}")
                self.check_generation()
                if time.monotonic() > deadline:
                    ask = SimpleNamespace(sock=f"s{self.owners[server]}", key=self.key)
                    missing = self.engine.status.missing_ranks(None, [ask], rnd or 0)
                    raise PushPullError(
                        f"sparse table {self.name!r}: server {self.owners[server]} did not answer {what} within "
                        f"{self.engine.cfg.timeout:.0f}s (PUSHPULL_TIMEOUT): {missing} (a round completes when "
                        f"every worker pushed it: does every worker call step() once per step?)")
                continue
            for m in messages(s.recv_multipart(copy=False)):
                h = m.header
                if h.key != self.key or h.gen != self.gen:
                    continue
                if h.type == MsgType.ERROR:  # answers still in flight could be misread later: the table is done
                    self.error = str(decode_json(m.body()).get("error", "unknown server error"))
                    raise PushPullError(self.error)
                if (self.stream is not None and h.type == MsgType.SPARSE_ROWS and h.flags & Flags.CHANGED
                        and h.round == self.stream.round):  # a commit's copy, read between steps
                    self.stream.take(server, m)
                    if want == MsgType.SPARSE_COPY:
                        return m
                    continue
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
                raise PushPullError(f"sparse table {self.name!r}: server {self.owners[j]} answered {len(buf)} bytes "
                                    f"for {hi - lo} rows of {self.dim} float32")
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

    def load(self, ids: np.ndarray, values: np.ndarray, accum: np.ndarray | None = None) -> None:
        """Write rows (rank 0 loading the table's start, or a worker its copy after a change; ``accum``: their
        Adagrad accumulators); returns once every server stored them."""
        self._rows(ids, values, Header(MsgType.SPARSE_PUSH, key=self.key, flags=Flags.SET), chunked=True,
                   accum=accum)
        self.flush()

    def changed(self, lo: int, hi: int, since: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The rows of [lo, hi) that a round after ``since`` changed (``since`` < 0: every row), as they are
        after this worker's last round: (ids, rows, Adagrad accumulators or None). What an elastic job's copy of
        the table takes at each commit."""
        adagrad = self.optimizer.get("name") == "adagrad"
        asked = []
        for j in range(self.servers):
            a, b = max(lo, self.bounds[j]), min(hi, self.bounds[j + 1])
            for c in range(a, b, self.copy_chunk_rows):
                rng = np.array([c, min(b, c + self.copy_chunk_rows)], dtype=np.int64)
                self._send(j, Header(MsgType.SPARSE_PULL, key=self.key, round=self.round, flags=Flags.CHANGED,
                                     extra=since + 1 if since >= 0 else 0, dtype=dtype_code("int64"), nbytes=16),
                           [rng])
                asked.append(j)
        parts = [self._changed_rows(j, self._recv(j, MsgType.SPARSE_ROWS, self.round,
                                                  f"the pull of changed rows of round {self.round}"))
                 for j in asked]  # answers come in the order asked, per server
        return _joined(parts, self.dim, adagrad)

    def _changed_rows(self, j: int, m) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(ids, rows, accumulators or None) of a SPARSE_ROWS|CHANGED answer from range ``j``'s server."""
        adagrad = self.optimizer.get("name") == "adagrad"
        n = m.header.numel
        want = 3 if adagrad else 2
        if not m.header.flags & Flags.CHANGED or len(m.frames) != want:
            raise PushPullError(f"sparse table {self.name!r}: server {self.owners[j]} answered a pull of changed "
                                f"rows with {len(m.frames)} frames, expected {want}")
        got = [np.frombuffer(frame_view(f), dtype=d) for f, d in zip(m.frames, ("<i8", "<f4", "<f4"))]
        if len(got[0]) != n or any(len(g) != n * self.dim for g in got[1:]):
            raise PushPullError(f"sparse table {self.name!r}: server {self.owners[j]}'s changed rows do not "
                                f"match their count ({n})")
        self.stats["bytes_pulled"] += sum(frame_view(f).nbytes for f in m.frames)
        return got[0], got[1].reshape(n, self.dim), got[2].reshape(n, self.dim) if adagrad else None

    def copy(self, ranges: list[tuple[int, int]], since: int) -> "CopyStream":
        """Start reading the rows of ``ranges`` changed after round ``since`` as they are after this worker's last
        round, while training goes on: the servers keep those rows until every worker closed its copy. Every
        worker opens one on every server before its next push (the servers' snapshot must begin there)."""
        if self.stream is not None:
            raise PushPullError(f"sparse table {self.name!r}: a commit's copy is open already (round "
                                f"{self.stream.round})")
        self.flush()
        self.stream = CopyStream(self, ranges, since)
        return self.stream

    def _rows(self, ids: np.ndarray, vals: np.ndarray, proto: Header, chunked: bool, accum=None) -> None:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        vals = np.ascontiguousarray(vals, dtype=np.float32).reshape(len(ids), self.dim)
        if accum is not None:
            accum = np.ascontiguousarray(accum, dtype=np.float32).reshape(len(ids), self.dim)
        per_message = self.chunk_rows if accum is None else self.copy_chunk_rows
        for j, sl in self._split(ids):
            n = sl.stop - sl.start
            if not chunked and n > per_message:
                raise PushPullError(f"sparse table {self.name!r}: {n} rows for server {self.owners[j]} in one step, "
                                    f"more than a message holds ({per_message} rows; PUSHPULL_MAX_MESSAGE_BYTES)")
            step = per_message if chunked else max(n, 1)
            for lo in range(sl.start, max(sl.stop, sl.start + 1), step):
                hi = min(sl.stop, lo + step)
                h = Header(proto.type, key=proto.key, round=proto.round if not chunked else 1, flags=proto.flags,
                           extra=proto.extra, dtype=FLOAT32, numel=hi - lo, nbytes=4 * (hi - lo) * self.dim)
                self._send(j, h, [ids[lo:hi], vals[lo:hi]] + ([accum[lo:hi]] if accum is not None else []))
                self.unacked[j] += 1
                self.stats["bytes_pushed"] += 8 * (hi - lo) + 4 * (hi - lo) * self.dim
        self.stats["rows_pushed"] += len(ids)

    def flush(self) -> None:
        """Wait for every push's acknowledgement (the server's error, if any, is raised here)."""
        for j in range(self.servers):
            while self.unacked[j]:
                self._recv(j, MsgType.SPARSE_ACK, None, "a push's acknowledgement")


def _joined(parts: list, dim: int, adagrad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Answers of changed rows, (ids, rows, accumulators) each, as one."""
    return (np.concatenate([np.empty(0, np.int64)] + [p[0] for p in parts]),
            np.concatenate([np.empty((0, dim), np.float32)] + [p[1] for p in parts]),
            np.concatenate([np.empty((0, dim), np.float32)] + [p[2] for p in parts]) if adagrad else None)


class CopyStream:
    """One commit's copy of some row ranges, read from the servers' snapshot a few rows per step
    (:meth:`advance`, just before each push: the answers come down while the push goes up) and completed by
    :meth:`finish`. Why: a commit that fetched every changed row at once stopped training for the whole
    transfer (the table, with uniform ids, every few hundred steps); spread over the steps after it, it uses the
    direction of each link a step leaves idle."""

    def __init__(self, client: SparseClient, ranges: list[tuple[int, int]], since: int):
        self.client, self.round, self.since = client, client.round, since
        self.adagrad = client.optimizer.get("name") == "adagrad"
        # the reads to make, in order: (range index, server, lo, hi), each at most a message's answer
        self.todo: list[tuple[int, int, int, int]] = []
        for i, (lo, hi) in enumerate(ranges):
            for j in range(client.servers):
                a, b = max(lo, client.bounds[j]), min(hi, client.bounds[j + 1])
                step = client.copy_chunk_rows
                self.todo += [(i, j, c, min(b, c + step)) for c in range(a, b, step)]
        self.todo.reverse()  # popped from the end
        self.rows_left = sum(hi - lo for _, _, lo, hi in self.todo)
        self.asked: list[list[int]] = [[] for _ in range(client.servers)]  # per server: range index of each answer
        self.parts: list[list] = [[] for _ in ranges]
        for j in range(client.servers):
            client._send(j, Header(MsgType.SPARSE_COPY, key=client.key, round=self.round, numel=COPY_OPEN), [])

    def advance(self, rows: int) -> None:
        """Ask for about ``rows`` more rows of the ranges (their changed ones come back)."""
        while self.todo and rows > 0:
            i, j, lo, hi = self.todo.pop()
            if hi - lo > rows:  # the rest of this piece later
                self.todo.append((i, j, lo + rows, hi))
                hi = lo + rows
            rows -= hi - lo
            self.rows_left -= hi - lo
            self._ask(j, COPY_READ, i, np.array([lo, hi], dtype=np.int64))

    def _ask(self, j: int, step: int, i: int, body: np.ndarray | None) -> None:
        c = self.client
        c._send(j, Header(MsgType.SPARSE_COPY, key=c.key, round=self.round, numel=step,
                          extra=self.since + 1 if self.since >= 0 else 0, dtype=dtype_code("int64"),
                          nbytes=16 if body is not None else 0), [body] if body is not None else [])
        self.asked[j].append(i)

    def take(self, j: int, m) -> None:
        """An answer from range ``j``'s server (they come in the order asked)."""
        if not self.asked[j]:
            raise PushPullError(f"sparse table {self.client.name!r}: server {self.client.owners[j]} sent rows of a "
                                f"commit's copy nobody asked for")
        i = self.asked[j].pop(0)
        part = self.client._changed_rows(j, m)
        if i >= 0:
            self.parts[i].append(part)

    def finish(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """Read the rest and close the copy on every server: per range, (ids, rows, accumulators or None)."""
        c = self.client
        self.advance(self.rows_left)
        for j in range(c.servers):
            self._ask(j, COPY_CLOSE, -1, None)
        for j in range(c.servers):
            while self.asked[j]:
                c._recv(j, MsgType.SPARSE_COPY, None, f"the copy of round {self.round}")
        c.stream = None
        return [_joined(p, c.dim, self.adagrad) for p in self.parts]
