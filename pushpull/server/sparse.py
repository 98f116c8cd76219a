"""Sparse tables on a server: rows ``[lo, hi)`` of an embedding table, and the optimizer for them.

Why the optimizer runs here (classic parameter server, as ps-lite's origin): the table lives on the
servers, partitioned by row ranges, so a worker holds only the rows its batch needs. If the workers
ran the optimizer, each would need the whole table (and its optimizer state) to apply the summed
gradients of rows other workers touched, or the servers would have to send those back: the bytes
per step would grow with the union of every worker's rows, not with one batch's. Here a step moves
each touched row twice (its gradient up, its new value down) and nothing else.

Rounds are synchronous, so training matches dense training: round r is complete when every worker
pushed its round-r rows (possibly none); the server then sums the gradients per row, divides by the
number of workers (DistributedOptimizer's average) and applies SGD or Adagrad to those rows only. A
pull for round r is answered once round r is applied, never earlier; a worker's next push follows
its pull on the same connection, so no pull can see a later round either.

What a peer can make this allocate is bounded: a table's size is declared at SPARSE_INIT and checked
against ``PUSHPULL_SPARSE_MAX_TABLE_BYTES`` (all tables of this server together), every row id is
checked against the table and this server's range, a pull's answer must fit in one message, at most
two rounds ahead are buffered, and at most MAX_WAITING pulls per worker wait for one round.
Everything runs on the server's I/O thread: a step's rows are a few MB, and one thread needs no locks.

In an elastic job the workers keep a copy of the table as of their last commit (pushpull.torch.SparseEmbedding):
each row remembers the round that last changed it, so a commit asks only for the rows changed since the
previous one. The commit's copy streams while training goes on (SPARSE_COPY): the table keeps the rows as
of the commit's round (:class:`Snapshot`, copy on write: a row is kept the first time a later round changes
it) until every worker has read its ranges, a few per step, in the direction a step's push leaves idle. A
change of the workers or of the servers drops every table here (:meth:`SparseStore.drop_all`); the workers
declare it again in the new layout and load it from their copies, so a lost server's rows come back from the
workers, and no round is lost or applied twice.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from pushpull.transport.protocol import (
    COPY_CLOSE, COPY_OPEN, COPY_READ, Flags, Header, Msg, MsgType, ProtocolError, bits_f32, decode_json, dtype_code,
    encode_json, frame_view,
)

FLOAT32 = dtype_code("float32")
OPTIMIZERS = {"sgd": {}, "adagrad": {"eps": 1e-10, "initial_accumulator_value": 0.0}}
MAX_DIM = 1 << 16
MAX_WAITING = 256  # pulls per worker that may wait for one round (a lookup sends one per server and message)
AHEAD = 2  # rounds a push may be ahead of the last applied one (a worker that stepped without a lookup)


class SparseError(ValueError):
    """A request that cannot be served; the text names the table, the rank and the value."""


def _rows_bytes(rows: int, dim: int, optimizer: str, elastic: bool = False) -> int:
    """What a range of a table may hold here: its rows and Adagrad's accumulators; an elastic table also a round
    per row, and room for a commit's snapshot (at most every row once more, with its round)."""
    held = rows * dim * 4 * (2 if optimizer == "adagrad" else 1)
    if not elastic:
        return held
    # per row: its round (4); a snapshot: per row its slot (4), and at most once its values and round (4), grown by
    # doubling (half as much again while the old room is copied into the new)
    return held + 4 * rows + 4 * rows + (held + 4 * rows) * 3 // 2


class Snapshot:
    """The rows of a range as of round ``round`` while later rounds change them, for a commit's copy that the
    workers read over many steps. Copy on write: before a round after ``round`` changes a row for the first
    time, its value (Adagrad accumulator, last round) is kept here; a row never changed since is read from the
    table itself. So it holds only the rows changed while the copy streams, at most the range once."""

    def __init__(self, rnd: int, rows: int, dim: int, adagrad: bool):
        self.round = rnd
        self.slot = np.full(rows, -1, dtype=np.int32)  # per local row: where its kept values are (-1: not kept)
        self.size, self.rows, self.dim, self.adagrad = 0, rows, dim, adagrad
        self.weight = np.empty((0, dim), np.float32)  # kept values, grown by doubling up to the range
        self.accum = np.empty((0, dim), np.float32) if adagrad else None
        self.touched = np.empty(0, np.int32)
        self.opened: set[int] = set()  # ranks that opened it
        self.closing: set[int] = set()  # ranks that asked to close it (no read after that)
        self.closed: set[int] = set()  # ranks whose close was answered (it goes once every rank's was)
        self.answered: dict[int, int] = {}  # rank -> changed rows answered (at most the range: each row once)

    def keep(self, rows: np.ndarray, t: "SparseTable") -> None:
        """Rows (local, unique) a round after ``round`` is about to change."""
        new = rows[self.slot[rows] < 0]
        if not len(new):
            return
        end = self.size + len(new)
        if end > len(self.touched):  # room for at least twice as many, at most every row
            cap = min(self.rows, max(2 * len(self.touched), end, 1024))
            self.weight = np.resize(self.weight, (cap, self.dim))
            self.touched = np.resize(self.touched, cap)
            if self.adagrad:
                self.accum = np.resize(self.accum, (cap, self.dim))
        self.weight[self.size:end] = t.weight[new]
        self.touched[self.size:end] = t.touched[new]
        if self.adagrad:
            self.accum[self.size:end] = t.accum[new]
        self.slot[new] = np.arange(self.size, end, dtype=np.int32)
        self.size = end

    def read(self, t: "SparseTable", lo: int, hi: int, since: int):
        """(ids, rows, accumulators or None) of the rows in [lo, hi) that a round in (since, ``round``] changed,
        as they were after ``round``."""
        a, b = lo - t.lo, hi - t.lo
        slot = self.slot[a:b]
        kept = np.flatnonzero(slot >= 0)
        touched = t.touched[a:b].copy()
        touched[kept] = self.touched[slot[kept]]
        changed = np.flatnonzero(touched > since) if since >= 0 else np.arange(b - a)
        w = t.weight[a + changed]
        acc = t.accum[a + changed] if t.accum is not None else None
        back = slot[changed]
        old = np.flatnonzero(back >= 0)  # rows of the answer changed after ``round``: their kept values
        w[old] = self.weight[back[old]]
        if acc is not None:
            acc[old] = self.accum[back[old]]
        return (changed + lo).astype(np.int64), w, acc


@dataclass
class SparseTable:
    key: int
    name: str
    rows: int          # rows of the whole table
    dim: int
    lo: int            # this server's rows: [lo, hi)
    hi: int
    optimizer: dict    # {"name": "sgd" | "adagrad", ...its options}
    num_workers: int
    elastic: bool = False  # the workers keep copies of it: each row remembers the round that last changed it
    weight: np.ndarray = field(init=False)
    accum: np.ndarray | None = field(init=False, default=None)
    applied: int = 0   # rounds applied so far
    pending: dict = field(default_factory=dict)   # round -> {rank: (ids, grads, lr)}
    waiting: dict = field(default_factory=dict)   # round -> [(identity, rank, req_id, ids)]
    error: str | None = None  # a round that could not be applied: every later request gets this
    touched: np.ndarray | None = field(init=False, default=None)  # elastic: per row, the round that last changed
    #                                     it (0: none since the load)
    answered: dict = field(default_factory=dict)  # elastic: rank -> (round, changed rows answered to it then)
    snapshot: Snapshot | None = None  # elastic: a commit's copy being read by the workers
    stats: dict = field(default_factory=lambda: {"rows_pushed": 0, "rows_pulled": 0, "rounds": 0})

    def __post_init__(self) -> None:
        self.weight = np.zeros((self.hi - self.lo, self.dim), dtype=np.float32)
        if self.elastic:
            self.touched = np.zeros(self.hi - self.lo, dtype=np.int32)
        if self.optimizer["name"] == "adagrad":
            self.accum = np.full((self.hi - self.lo, self.dim), self.optimizer["initial_accumulator_value"],
                                 dtype=np.float32)

    def nbytes(self) -> int:
        return _rows_bytes(self.hi - self.lo, self.dim, self.optimizer["name"], self.elastic)

    # ---------------------------------------------------------------- checks --
    def ids(self, buf, numel: int, rank: int, what: str) -> np.ndarray:
        """Row ids of a request as int64, each inside this server's range (else an error naming the row)."""
        if len(buf) != 8 * numel:
            raise SparseError(f"sparse table {self.name!r}: rank {rank}'s {what} has {len(buf)} bytes of row ids "
                              f"for {numel} rows (8 bytes each)")
        ids = np.frombuffer(buf, dtype="<i8")
        if numel:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < self.lo or hi >= self.hi:
                bad = lo if lo < self.lo else hi
                where = (f"out of range [0, {self.rows})" if not 0 <= bad < self.rows
                         else f"not on this server (it holds rows [{self.lo}, {self.hi}))")
                raise SparseError(f"sparse table {self.name!r}: rank {rank}'s {what} has row {bad}, {where}")
        return ids

    def values(self, buf, numel: int, dtype: int, rank: int, what: str) -> np.ndarray:
        if dtype != FLOAT32:
            raise SparseError(f"sparse table {self.name!r}: rank {rank}'s {what} rows must be float32")
        if len(buf) != 4 * numel * self.dim:
            raise SparseError(f"sparse table {self.name!r}: rank {rank}'s {what} has {len(buf)} bytes for {numel} "
                              f"rows of {self.dim} float32 ({4 * numel * self.dim} bytes)")
        return np.frombuffer(buf, dtype="<f4").reshape(numel, self.dim)

    # ---------------------------------------------------------------- rounds --
    def set_rows(self, ids: np.ndarray, vals: np.ndarray, accum: np.ndarray | None = None) -> None:
        """Write rows (loading the table from a worker's copy), and their Adagrad accumulators if given."""
        self.weight[ids - self.lo] = vals
        if accum is not None and self.accum is not None:
            self.accum[ids - self.lo] = accum

    def changed(self, lo: int, hi: int, since: int) -> np.ndarray:
        """Ids of the rows in [lo, hi) that a round after ``since`` changed (``since`` < 0: every row)."""
        if since < 0:
            return np.arange(lo, hi, dtype=np.int64)
        return np.flatnonzero(self.touched[lo - self.lo:hi - self.lo] > since).astype(np.int64) + lo

    def push(self, rnd: int, rank: int, ids: np.ndarray, grads: np.ndarray, lr: float) -> list[int]:
        """Add rank ``rank``'s gradients of round ``rnd``; returns the rounds applied by it (in order)."""
        if not self.applied < rnd <= self.applied + AHEAD:
            raise SparseError(f"sparse table {self.name!r}: rank {rank} pushed round {rnd}, the table is at round "
                              f"{self.applied} (a push must be for one of the next {AHEAD} rounds)")
        got = self.pending.setdefault(rnd, {})
        if rank in got:
            raise SparseError(f"sparse table {self.name!r} round {rnd}: rank {rank} pushed twice")
        got[rank] = (ids, grads, lr)
        self.stats["rows_pushed"] += len(ids)
        done = []
        while len(self.pending.get(self.applied + 1, ())) >= self.num_workers:
            self._apply(self.pending.pop(self.applied + 1))
            self.applied += 1
            done.append(self.applied)
        return done

    def _apply(self, pushes: dict) -> None:
        lrs = {lr for _, _, lr in pushes.values()}
        if len(lrs) > 1:
            by = ", ".join(f"rank {r}: {lr:g}" for r, (_, _, lr) in sorted(pushes.items()))
            self.error = (f"sparse table {self.name!r} round {self.applied + 1}: the workers pushed different "
                          f"learning rates ({by}); the round was not applied")
            raise SparseError(self.error)
        lr = np.float32(lrs.pop())
        ids = np.concatenate([p[0] for p in pushes.values()])
        if not len(ids):
            self.stats["rounds"] += 1
            return
        grads = np.concatenate([p[1] for p in pushes.values()])
        order = np.argsort(ids, kind="stable")
        ids, grads = ids[order], grads[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        rows = ids[starts] - self.lo
        g = np.add.reduceat(grads, starts, axis=0) if len(starts) < len(ids) else grads.copy()
        g *= np.float32(1.0 / self.num_workers)  # the average, as DistributedOptimizer's push_pull
        if self.snapshot is not None and self.applied >= self.snapshot.round:  # a commit's copy still reads them
            self.snapshot.keep(rows, self)
        if self.accum is None:  # SGD: w -= lr * g
            self.weight[rows] -= lr * g
        else:  # Adagrad (torch.optim.Adagrad without decay): acc += g^2; w -= lr * g / (sqrt(acc) + eps)
            acc = self.accum[rows] + g * g
            self.accum[rows] = acc
            self.weight[rows] -= lr * g / (np.sqrt(acc) + np.float32(self.optimizer["eps"]))
        if self.touched is not None:
            self.touched[rows] = self.applied + 1
        self.stats["rounds"] += 1

    def pull_ready(self, rnd: int, rank: int) -> bool:
        """Whether a pull of the table after round ``rnd`` can be answered now (False: it waits for it)."""
        if rnd > self.applied + AHEAD:
            raise SparseError(f"sparse table {self.name!r}: rank {rank} pulled round {rnd}, the table is at round "
                              f"{self.applied}")
        return rnd <= self.applied

    def read(self, ids: np.ndarray) -> np.ndarray:
        self.stats["rows_pulled"] += len(ids)
        return self.weight[ids - self.lo]


class SparseStore:
    """The sparse tables of one server and their declarations. ``reply(identity, header, frames)`` and
    ``error(identity, key, text, req_id)`` answer a worker; ``num_workers`` is set once registered."""

    def __init__(self, cfg, reply, error, keys_held):
        self.cfg = cfg
        self.reply = reply
        self.error = error
        self.keys_held = keys_held  # how many dense keys this server holds (PUSHPULL_SERVER_MAX_KEYS counts both)
        self.num_workers = 0
        self.tables: dict[int, SparseTable] = {}
        self.pending: dict[int, dict] = {}  # key -> {"since": t, "by": {rank: (identity, req_id, decl)}}

    def handle(self, identity: bytes, msg: Msg) -> None:
        h = msg.header
        try:
            if h.type == MsgType.SPARSE_INIT:
                self._init(identity, msg)
                return
            t = self.tables.get(h.key)
            if t is None:
                raise SparseError(f"{h.type.name} for sparse key {h.key} before its SPARSE_INIT completed")
            if t.error is not None:
                raise SparseError(t.error)
            if h.type == MsgType.SPARSE_PUSH:
                self._push(identity, msg, t)
            elif h.type == MsgType.SPARSE_COPY:
                self._copy(identity, msg, t)
            elif h.type == MsgType.SPARSE_PULL and h.flags & Flags.CHANGED:
                self._pull_changed(identity, msg, t)
            elif h.type == MsgType.SPARSE_PULL:
                what = f"pull of round {h.round}"
                if 4 * h.numel * t.dim > self.cfg.max_message_bytes:  # the answer, not only the ids, is bounded
                    raise SparseError(f"sparse table {t.name!r}: rank {h.sender}'s {what} asks for {h.numel} rows, "
                                      f"{4 * h.numel * t.dim} bytes, over PUSHPULL_MAX_MESSAGE_BYTES="
                                      f"{self.cfg.max_message_bytes}")
                self._answer_or_wait(identity, h, t, t.ids(msg.body_view(), h.numel, h.sender, what), what)
        except (SparseError, ProtocolError) as e:
            self.error(identity, h.key, str(e), h.req_id)

    def _init(self, identity: bytes, msg: Msg) -> None:
        h = msg.header
        d = decode_json(msg.body())
        name = str(d.get("name"))[:200]
        try:
            rows, dim, lo, hi = (int(d[k]) for k in ("rows", "dim", "lo", "hi"))
            elastic = bool(d.get("elastic", False))
            opt = dict(d.get("optimizer") or {})
            oname = str(opt.pop("name", ""))
            if oname not in OPTIMIZERS or set(opt) - set(OPTIMIZERS[oname]):
                raise ValueError(f"optimizer {d.get('optimizer')!r} (known: sgd; adagrad with eps, "
                                 f"initial_accumulator_value)")
            opt = {"name": oname, **{k: float(opt.get(k, v)) for k, v in OPTIMIZERS[oname].items()}}
        except (KeyError, TypeError, ValueError) as e:
            raise SparseError(f"sparse table {name!r}: declaration not understood: {e}") from None
        if not (rows >= 1 and 1 <= dim <= MAX_DIM and 0 <= lo <= hi <= rows):
            raise SparseError(f"sparse table {name!r}: rows={rows} dim={dim} range [{lo}, {hi}) not accepted "
                              f"(rows >= 1, 1 <= dim <= {MAX_DIM}, 0 <= lo <= hi <= rows)")
        t = self.tables.get(h.key)
        decl = {"name": name, "rows": rows, "dim": dim, "lo": lo, "hi": hi, "optimizer": opt, "elastic": elastic}
        if t is not None:
            if (t.name, t.rows, t.dim, t.lo, t.hi, t.optimizer, t.elastic) != (name, rows, dim, lo, hi, opt, elastic):
                raise SparseError(f"sparse table {name!r} re-declared by rank {h.sender} differently: {decl}")
            self.reply(identity, Header(MsgType.SPARSE_ACK, key=h.key, req_id=h.req_id))
            return
        if h.key not in self.pending:
            if len(self.tables) + len(self.pending) + self.keys_held() >= self.cfg.server_max_keys:
                raise SparseError(f"this server holds PUSHPULL_SERVER_MAX_KEYS={self.cfg.server_max_keys} keys "
                                  f"already; sparse table {name!r} refused")
            held = sum(t.nbytes() for t in self.tables.values())
            need = _rows_bytes(hi - lo, dim, oname, elastic)
            if held + need > self.cfg.sparse_max_table_bytes:
                raise SparseError(f"sparse table {name!r}: rows [{lo}, {hi}) x {dim} need {need} bytes on this "
                                  f"server, {held} held already; PUSHPULL_SPARSE_MAX_TABLE_BYTES="
                                  f"{self.cfg.sparse_max_table_bytes}")
        pend = self.pending.setdefault(h.key, {"since": time.monotonic(), "by": {}})
        pend["by"][h.sender] = (identity, h.req_id, decl)
        if len(pend["by"]) < self.num_workers:
            return
        del self.pending[h.key]
        variants: dict[str, list[int]] = {}
        for r, (_, _, dd) in sorted(pend["by"].items()):
            variants.setdefault(str(dd), []).append(r)
        if len(variants) > 1:
            text = f"sparse table {name!r} (key {h.key}) differs across workers: " + "; ".join(
                f"rank(s) {rs}: {v}" for v, rs in variants.items())
            for ident, req_id, _ in pend["by"].values():
                self.error(ident, h.key, text, req_id)
            return
        self.tables[h.key] = SparseTable(h.key, name, rows, dim, lo, hi, opt, self.num_workers, elastic)
        for ident, req_id, _ in pend["by"].values():
            self.reply(ident, Header(MsgType.SPARSE_ACK, key=h.key, req_id=req_id))

    def _pull_changed(self, identity: bytes, msg: Msg, t: SparseTable) -> None:
        """A worker's copy asks for the rows of [lo, hi) changed after round ``extra - 1`` (``extra`` 0: every
        row), as they are once round ``h.round`` is applied."""
        h = msg.header
        if t.touched is None:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender} asked for changed rows of a table declared "
                              f"outside an elastic job")
        if h.round < t.applied:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender} asked for the rows changed as of round "
                              f"{h.round}, the table is at round {t.applied}")
        lo, hi = self._asked_range(msg, t, "pull of changed rows")
        self._answer_or_wait(identity, h, t, ("changed", lo, hi, int(h.extra) - 1, h.sender), "pull of changed rows")

    def _asked_range(self, msg: Msg, t: SparseTable, what: str) -> tuple[int, int]:
        """The row range [lo, hi) a pull of changed rows or a copy's read asks for (two int64): inside this server's
        rows, and with an answer that fits in a message whatever changed."""
        h = msg.header
        buf = msg.body_view()
        if len(buf) != 16:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender}'s {what} has {len(buf)} bytes, expected 16 "
                              f"(the range)")
        lo, hi = (int(x) for x in np.frombuffer(buf, dtype="<i8"))
        if not t.lo <= lo <= hi <= t.hi:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender}'s {what} asked for rows [{lo}, {hi}), this "
                              f"server holds [{t.lo}, {t.hi})")
        per_row = 8 + 4 * t.dim * (2 if t.accum is not None else 1)
        if (hi - lo) * per_row > self.cfg.max_message_bytes:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender}'s {what} of rows [{lo}, {hi}) could need "
                              f"{(hi - lo) * per_row} bytes, over PUSHPULL_MAX_MESSAGE_BYTES="
                              f"{self.cfg.max_message_bytes}")
        return lo, hi

    def _copy(self, identity: bytes, msg: Msg, t: SparseTable) -> None:
        """A step of a commit's copy of round ``h.round`` (protocol COPY_*): open it (the first rank to do so makes
        the snapshot: every rank opens it before it pushes the next round, so no later round is applied before),
        read a range of it (answered once the round is applied), close it (forgotten once every rank did)."""
        h = msg.header
        if t.touched is None:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender} asked for a commit's copy of a table declared "
                              f"outside an elastic job")
        snap = t.snapshot
        if h.numel == COPY_OPEN:
            if snap is None:
                if not t.applied <= h.round <= t.applied + AHEAD:
                    raise SparseError(f"sparse table {t.name!r}: rank {h.sender} opened a copy of round {h.round}, the "
                                      f"table is at round {t.applied} (a copy is of it or of one of the next {AHEAD})")
                snap = t.snapshot = Snapshot(h.round, t.hi - t.lo, t.dim, t.accum is not None)
            elif snap.round != h.round:
                raise SparseError(f"sparse table {t.name!r}: rank {h.sender} opened a copy of round {h.round} while "
                                  f"the copy of round {snap.round} is open (rank(s) "
                                  f"{sorted(set(range(t.num_workers)) - snap.closed)} have not closed it)")
            snap.opened.add(h.sender)
            return
        if snap is None or snap.round != h.round or h.sender not in snap.opened or h.sender in snap.closing:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender} read or closed a copy of round {h.round} it "
                              f"has not open (open: {'none' if snap is None else f'round {snap.round}'})")
        if h.numel == COPY_CLOSE:
            snap.closing.add(h.sender)
            self._answer_or_wait(identity, h, t, ("close", h.sender, snap), "close of a copy")
            return
        if h.numel != COPY_READ:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender} sent copy step {h.numel} (known: "
                              f"{COPY_OPEN} open, {COPY_READ} read, {COPY_CLOSE} close)")
        lo, hi = self._asked_range(msg, t, "read of a copy")
        self._answer_or_wait(identity, h, t, ("copy", lo, hi, int(h.extra) - 1, h.sender, snap), "read of a copy")

    def _answer_or_wait(self, identity: bytes, h: Header, t: SparseTable, what_rows, what: str) -> None:
        """Answer a pull of round ``h.round`` now if it is applied, else once it is (a bounded wait list)."""
        if t.pull_ready(h.round, h.sender):
            self._answer(identity, h.req_id, h.round, t, what_rows)
            return
        waits = t.waiting.setdefault(h.round, [])
        if len(waits) >= MAX_WAITING * self.num_workers:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender}'s {what}: {len(waits)} pulls of round "
                              f"{h.round} wait already ({MAX_WAITING} per worker at most)")
        waits.append((identity, h.sender, h.req_id, what_rows))

    def owns(self, key: int) -> bool:
        return key in self.tables or key in self.pending

    def status(self, identity: bytes, h: Header) -> None:
        """Which ranks table ``h.key`` has heard from for round ``h.round`` (or its declaration), so that a
        worker whose wait timed out can name the ranks it waits for."""
        everyone = set(range(self.num_workers))
        pend = self.pending.get(h.key)
        if pend is not None:
            have, stage = set(pend["by"]), "declared it"
        else:
            t = self.tables[h.key]
            have = everyone if h.round <= t.applied else set(t.pending.get(h.round, ()))
            stage = f"pushed round {h.round} of it"
        self.reply(identity, Header(MsgType.STATUS_RESP, key=h.key, round=h.round),
                   [encode_json({"stage": stage, "have": sorted(have), "missing": sorted(everyone - have)})])

    def fail_all(self, reason: str) -> None:
        """The workers changed (elastic) or one joined: a sparse table's rounds need every worker it was
        declared with, so each fails now, and every pull waiting on one hears why, instead of timing out."""
        for t in self.tables.values():
            if t.error is None:
                t.error = f"sparse table {t.name!r}: {reason}; sparse tables do not support it (docs/sparse.md)"
            for waits in t.waiting.values():
                for ident, _, req_id, _ in waits:
                    self.error(ident, t.key, t.error, req_id)
            t.waiting.clear()

    def drop_all(self) -> None:
        """The workers or the servers changed in an elastic job: every table goes (its rounds need the workers it
        was declared with, and its rows may belong elsewhere now). The workers declare it again in the new layout
        and load it from the copies they kept at their last commit; requests still in flight carry the old
        generation and are not answered (their senders learn of the change from the scheduler)."""
        self.tables.clear()
        self.pending.clear()

    def check_inits(self, timeout: float) -> None:
        """Declarations that some rank never sent: fail them, naming the ranks (called every second)."""
        now = time.monotonic()
        for key, pend in list(self.pending.items()):
            if now - pend["since"] > timeout:
                missing = sorted(set(range(self.num_workers)) - set(pend["by"]))
                name = next(iter(pend["by"].values()))[2]["name"]
                for ident, req_id, _ in pend["by"].values():
                    self.error(ident, key, f"sparse table {name!r}: rank(s) {missing} never declared it within "
                                           f"{timeout:.0f}s (ranks {sorted(pend['by'])} did)", req_id)
                del self.pending[key]

    def _push(self, identity: bytes, msg: Msg, t: SparseTable) -> None:
        h = msg.header
        loading = bool(h.flags & Flags.SET)
        frames = (2, 3) if loading and t.accum is not None else (2,)  # a load may carry Adagrad's accumulators
        if len(msg.frames) not in frames:
            raise SparseError(f"sparse table {t.name!r}: rank {h.sender}'s push has {len(msg.frames)} frames, "
                              f"expected {' or '.join(map(str, frames))} (row ids, rows"
                              f"{', accumulators' if len(frames) > 1 else ''})")
        what = "load" if loading else f"push of round {h.round}"
        ids = t.ids(frame_view(msg.frames[0]), h.numel, h.sender, what)
        vals = t.values(frame_view(msg.frames[1]), h.numel, h.dtype, h.sender, what)
        if loading:
            accum = t.values(frame_view(msg.frames[2]), h.numel, h.dtype, h.sender, "load's accumulators") \
                if len(msg.frames) == 3 else None
            t.set_rows(ids, vals, accum)
            self.reply(identity, Header(MsgType.SPARSE_ACK, key=h.key, round=h.round, req_id=h.req_id))
            return
        try:
            done = t.push(h.round, h.sender, ids, vals, bits_f32(h.extra))
        except SparseError:
            if t.error is not None:  # the round failed: everyone waiting on it hears why
                for waits in t.waiting.values():
                    for ident, _, req_id, _ in waits:
                        self.error(ident, h.key, t.error, req_id)
                t.waiting.clear()
            raise
        if not h.flags & Flags.NO_ACK:
            self.reply(identity, Header(MsgType.SPARSE_ACK, key=h.key, round=h.round, req_id=h.req_id))
        for rnd in done:
            for ident, _, req_id, ids in t.waiting.pop(rnd, ()):
                self._answer(ident, req_id, rnd, t, ids)

    def _answer(self, identity: bytes, req_id: int, rnd: int, t: SparseTable, ids) -> None:
        """The rows ``ids`` after round ``rnd``; or, for a ("changed", lo, hi, since, rank) pull, the ids of the rows
        changed since, their values and (Adagrad) their accumulators."""
        if isinstance(ids, tuple) and ids[0] == "close":
            _, rank, snap = ids
            snap.closed.add(rank)
            if snap.closed >= set(range(t.num_workers)) and t.snapshot is snap:
                t.snapshot = None
            self.reply(identity, Header(MsgType.SPARSE_ROWS, key=t.key, round=rnd, req_id=req_id, dtype=FLOAT32,
                                        flags=Flags.CHANGED), [np.empty(0, np.int64), np.empty(0, np.float32)] +
                       ([np.empty(0, np.float32)] if t.accum is not None else []))
            return
        if isinstance(ids, tuple) and ids[0] == "copy":
            _, lo, hi, since, rank, snap = ids  # a read arrives before its rank's close, so its copy is still kept
            got, rows, acc = snap.read(t, lo, hi, since)
            count = snap.answered.get(rank, 0) + len(got)
            if count > t.hi - t.lo:  # each row once per copy: a 16-byte request cannot be repeated without bound
                self.error(identity, t.key, f"sparse table {t.name!r}: rank {rank} read {count} rows of the copy of "
                                            f"round {rnd}, more than this server's {t.hi - t.lo}", req_id)
                return
            snap.answered[rank] = count
            t.stats["rows_pulled"] += len(got)
            self.reply(identity, Header(MsgType.SPARSE_ROWS, key=t.key, round=rnd, req_id=req_id, dtype=FLOAT32,
                                        numel=len(got), nbytes=rows.nbytes, flags=Flags.CHANGED),
                       [got, rows] + ([acc] if acc is not None else []))
            return
        if isinstance(ids, tuple):
            _, lo, hi, since, rank = ids
            got = t.changed(lo, hi, since)
            # a worker takes its shards' rows whole once per change (or at the start) and then only the rows changed
            # between two commits: at most twice this server's range per round, so a 16-byte request cannot be
            # repeated into answers without bound
            was, count = t.answered.get(rank, (rnd, 0))
            count = (count if was == rnd else 0) + len(got)
            if count > 2 * (t.hi - t.lo):
                self.error(identity, t.key, f"sparse table {t.name!r}: rank {rank} asked for {count} changed rows in "
                                            f"round {rnd}, more than twice this server's {t.hi - t.lo}", req_id)
                return
            t.answered[rank] = (rnd, count)
            rows = t.read(got)
            frames = [got, rows] + ([t.accum[got - t.lo]] if t.accum is not None else [])
            self.reply(identity, Header(MsgType.SPARSE_ROWS, key=t.key, round=rnd, req_id=req_id, dtype=FLOAT32,
                                        numel=len(got), nbytes=rows.nbytes, flags=Flags.CHANGED), frames)
            return
        rows = t.read(ids)
        self.reply(identity, Header(MsgType.SPARSE_ROWS, key=t.key, round=rnd, req_id=req_id, dtype=FLOAT32,
                                    numel=len(ids), nbytes=rows.nbytes), [rows])

