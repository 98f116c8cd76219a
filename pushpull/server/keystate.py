"""Per-key round state on a server, double-buffered.

Round r lives in slot r % 2. A slot is reused for round r + 2 only after every
worker pulled round r, so a fast worker's next push can never overwrite a sum a
slow worker has not pulled yet (a defect of BytePS). Protocol misuse (a push two
rounds ahead, a duplicate push, a pull before one's push) is reported, not
silently mis-summed.

Backup workers (Chen et al. 2016, "Revisiting Distributed Synchronous SGD"): a key declared with
``backup_workers=b`` completes a round with the first n - b pushes; a push for a round that already
completed is dropped (counted per rank in ``dropped``) and its pull answered with that round's result,
so every rank applies the same sums. Such a key keeps ``depth`` rounds (not 2), so the fast workers
can run that many rounds ahead of a straggler before a push of theirs waits (:class:`Busy`) for the
straggler to pull the round whose slot it needs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from pushpull.server.reduce import ACC_NP, WIRE_NP, Accumulator, Concat, to_wire
from pushpull.transport.protocol import describe_sig, dtype_code


class RoundError(ValueError):
    pass


class Busy(Exception):
    """Backup workers: the push's slot still holds a round a late rank has not pulled; the server keeps
    the push and serves it once that rank pulls (the pushing worker's own timeout bounds the wait)."""


class Disagreement(RoundError):
    """The workers gave different round signatures (root, dtype, average, ...): the round is failed
    for every rank, those waiting on it included (``slot.waiting``)."""

    def __init__(self, text: str, slot: "Slot"):
        super().__init__(text)
        self.slot = slot


def _disagreement(name: str, sigs: dict, expected: set) -> str:
    fields = {r: describe_sig(s) for r, s in sigs.items()}
    parts = []
    for what in next(iter(fields.values())):
        values: dict = {}
        for r in sorted(fields):
            values.setdefault(str(fields[r][what]), []).append(r)
        if len(values) > 1:
            parts.append(f"{what}: " + ", ".join(f"rank(s) {rs} gave {v}" for v, rs in values.items()))
    text = f"tensor {name!r}: the workers disagree on " + "; ".join(parts)
    later = sorted(expected - set(sigs))
    return text + (f" (rank(s) {later} had not pushed yet)" if later else "")


@dataclass
class Slot:
    round: int = -1
    pushed: set = field(default_factory=set)
    pulled: set = field(default_factory=set)
    asked: set = field(default_factory=set)  # ranks that pulled this round, answered or waiting
    waiting: list = field(default_factory=list)  # (identity, rank, req_id) pulls before the round completed
    acc: Accumulator | Concat | None = None
    sigs: dict = field(default_factory=dict)  # rank -> the round signature it pushed
    error: str | None = None  # the workers disagreed: every push and pull of the round gets this
    out: object = None  # the payload answered to pulls (ndarray or bytes)
    wire: object = None  # ``out`` as one frame shared by every pull answer (made on the first)
    ready: bool = False
    count: int = 0  # backup workers: pushes summed into ``out`` (the divisor of an average)
    opened: float = 0.0  # when its first push came (time.monotonic()): round latency, an outer round's span


OUTER_AUTO_FACTOR = 3.0   # round_deadline="auto": this many times the median span of the recent rounds,
OUTER_AUTO_FLOOR_S = 2.0  # and never under this many seconds,
OUTER_AUTO_HISTORY = 8    # over the last this many complete rounds,
OUTER_AUTO_MIN_ROUNDS = 3  # once this many have been measured (before: every round waits for everyone)

LATE = object()  # KeyState.push's answer for a backup key's push that came after its round completed


@dataclass
class KeyState:
    key: int
    name: str
    dtype: str
    numel: int
    num_workers: int
    compression: dict | None = None
    codec: object = None  # server-side compression (decompress pushes, re-compress the sum)
    slots: list = field(default_factory=lambda: [Slot(), Slot()])
    store: np.ndarray | None = None  # async mode: the parameters
    outer: object = None  # op "outer" (DiLoCo, local SGD): pushpull.outer.OuterSGD, the global parameters
    # an outer key's rounds go by the round's id (the pushes' signature), not by each worker's count: after
    # a change of the workers a retried round keeps its id. Open rounds by id, and the last one stepped
    outer_rounds: dict = field(default_factory=dict)
    outer_done: tuple | None = None  # (id, the answer: the global parameters after that round)
    # DiLoCo(round_deadline=...): None = wait for every worker; "auto" = OUTER_AUTO_FACTOR x the median span
    # (first push to last) of the recent complete rounds; seconds = that. Past it a round completes without
    # the workers that have not pushed (their late pushes are answered with its result, not counted)
    outer_deadline: object = None
    round_s: float = 0.0  # the first-push-to-sum time of every round completed here, summed (metrics)
    rounds_timed: int = 0  # ... and how many rounds that is
    outer_spans: list = field(default_factory=list)  # spans of the last OUTER_AUTO_HISTORY complete rounds
    inline: bool = False  # small: summed on the receiving thread, a hand-off costs more than the sum
    op: str = "sum"  # sum | min | max | product | concat
    readers: frozenset | None = None  # ranks that receive the result (None: all); the others get an empty body
    wire_nbytes: int = field(init=False)  # bytes of an uncompressed push (checked on every push)
    code: int = field(init=False)  # the dtype's header code (a push's is compared with it)
    joined: set = field(default_factory=set)  # ranks that called join(): the server's set, shared
    # a broadcast's round cannot complete without a rank in join() (its root's value may be the missing one):
    # such a round fails on every rank naming the joined ranks (Horovod raises too)
    needs_every_rank: bool = False
    backup: int = 0  # backup workers: a round completes with the first num_workers - backup pushes
    completed: int = 0  # backup keys: the highest round completed (told to pullers, so a late one catches up)
    dropped: dict = field(default_factory=dict)  # rank -> pushes dropped because their round had completed
    deferred: list = field(default_factory=list)  # (identity, msg) pushes waiting for a late rank's pull (Busy)
    # the ranks that push this key (None: every worker). With the local reduce each machine's processes
    # reduce together first and one of them pushes each slice, so a slice's key has one pusher per machine
    writers: frozenset | None = None
    pushes: int = 0  # pushes summed since the last reset: BYTEPS_SERVER_ENABLE_SCHEDULE serves keys with fewer first
    # same-host workers (pushpull.transport.shm): the key's shared region, each sharing rank's push slot in it,
    # the ranks whose request in flight came through it (their answer goes there too; a rank's requests for a
    # key come one at a time), and the sharing ranks that have not pushed yet (the file is unlinked after them)
    shm: object = None
    shm_slot: dict = field(default_factory=dict)
    shm_ranks: set = field(default_factory=set)
    shm_unseen: set = field(default_factory=set)

    def stop_sharing(self) -> None:
        """Back to the socket for every rank (the workers changed: slots belong to ranks that may be gone)."""
        self.shm = None
        self.shm_slot = {}
        self.shm_ranks = set()
        self.shm_unseen = set()

    def __post_init__(self) -> None:
        self.wire_nbytes = self.numel * np.dtype(WIRE_NP[self.dtype]).itemsize
        self.code = dtype_code(self.dtype)

    def use_backup(self, backup: int, depth: int) -> None:
        """Make this a backup-workers key: ``backup`` pushes per round may be missing, ``depth`` rounds kept."""
        self.backup = backup
        self.slots = [Slot() for _ in range(max(2, depth))]

    def covers(self, ranks: set) -> bool:
        """Whether ``ranks`` (with those that joined) are every rank this key waits for."""
        if self.writers is None:
            return len(ranks | self.joined) >= self.num_workers
        return self.writers <= (ranks | self.joined)

    def expected(self) -> set:
        return set(self.writers) if self.writers is not None else set(range(self.num_workers))

    def awaited(self, older_than: float, now: float) -> list[int]:
        """The ranks each round open longer than ``older_than`` seconds still waits for (a rank once per
        round): the metrics' late and missing ranks. Read from another thread: a glance, not a lock."""
        out = []
        for slot in list(self.slots):
            if slot.round != -1 and not slot.ready and slot.error is None and slot.pushed \
                    and now - slot.opened > older_than:
                out += sorted(self.expected() - slot.pushed - self.joined)
        return out

    def reset(self, num_workers: int) -> None:
        """A new generation of workers (elastic): no round survives, ``num_workers`` push each one now.
        New slots, so an engine thread still summing an old push writes into a slot nobody reads."""
        self.num_workers = num_workers
        self.slots = [Slot() for _ in self.slots]
        self.outer_rounds = {}  # the open outer rounds are retried by the workers (the stepped one is kept)
        self.completed = 0
        self.pushes = 0
        self.deferred = []
        if self.codec is not None and hasattr(self.codec, "reset"):
            self.codec.reset()

    def _slot_for_push(self, rnd: int, rank: int) -> Slot:
        if self.writers is not None and rank not in self.writers:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pushed round {rnd}, but only rank(s) "
                             f"{sorted(self.writers)} push this key")
        depth = len(self.slots)
        slot = self.slots[rnd % depth]
        if slot.round == rnd:
            if rank in slot.pushed:
                raise RoundError(f"tensor {self.name!r} round {rnd}: rank {rank} pushed twice")
            return slot
        if self.backup and slot.round != -1 and slot.round == rnd - depth and rank not in slot.pulled:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pushed round {rnd} before pulling round "
                             f"{slot.round}")
        if self.backup and slot.round != -1 and slot.round == rnd - depth and not self.covers(slot.pulled):
            raise Busy()
        if slot.round == -1 or (slot.round == rnd - depth and self.covers(slot.pulled)):
            slot.round = rnd
            slot.pushed.clear()
            slot.pulled.clear()
            slot.asked.clear()
            slot.waiting.clear()
            slot.ready = False
            slot.out = None
            slot.wire = None
            slot.sigs.clear()
            slot.error = None
            slot.count = 0
            slot.opened = time.monotonic()
            if slot.acc is None:
                slot.acc = Concat(self.numel) if self.op == "concat" else Accumulator(
                    self.dtype, self.numel, "sum" if self.op == "outer" else self.op, self._shared_acc(rnd % depth))
            return slot
        missing = sorted(self.expected() - slot.pulled)
        raise RoundError(f"tensor {self.name!r}: rank {rank} pushed round {rnd} while round {slot.round} "
                         f"has not been pulled by rank(s) {missing}")

    def abort(self, rnd: int, rank: int, error: str) -> None:
        """Rank ``rank`` cannot take part in round ``rnd``, or gave up on it after pushing (its deadline
        passed): the round fails on every rank with ``error``. Returns (nothing to do) where the round
        already completed: every rank that pulls it gets the right sum."""
        slot = self.slots[rnd % len(self.slots)]
        if slot.round == rnd and rank in slot.pushed:
            if slot.ready:
                return
            if slot.error is None:
                slot.error = error
            raise Disagreement(slot.error, slot)
        slot = self._slot_for_push(rnd, rank)
        if slot.error is None:
            slot.error = error
        raise Disagreement(slot.error, slot)

    def outer_push(self, rid: int, rank: int, data: np.ndarray, waiter: tuple, counts: bool = True) -> Slot | None:
        """One worker's push of outer round ``rid`` (``waiter``: whom to answer). Returns a slot holding the
        answer: the stepped round's (a retry of it, after the workers changed), or this round's when it
        just completed (its ``waiting`` lists every worker to answer); None while it waits for others.
        ``counts=False``: the worker is present but adds nothing (it came into the running job in this round;
        the mean is the others'). An outer key's answer is the global parameters, whole: only its pushes are
        ever compressed."""
        done = self.outer_done
        if done is not None and rid == done[0]:
            return Slot(round=rid, out=done[1], ready=True, waiting=[waiter])
        if done is not None and rid < done[0] and self.outer_deadline is not None:
            # a straggler past the deadline of a round stepped since: it takes the newest global parameters
            return Slot(round=rid, out=done[1], ready=True, waiting=[waiter])
        if done is None and rid != 1:
            raise RoundError(f"tensor {self.name!r}: outer round {rid} pushed to a key that holds no global "
                             f"parameters (its server was replaced, or the start round never ran here)")
        if done is not None and rid < done[0]:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pushed outer round {rid}, older than the last "
                             f"one stepped ({done[0]})")
        slot = self.outer_rounds.get(rid)
        if slot is None:
            if len(self.outer_rounds) >= 2:
                raise RoundError(f"tensor {self.name!r}: outer round {rid} opened while rounds "
                                 f"{sorted(self.outer_rounds)} wait for pushes")
            slot = self.outer_rounds[rid] = Slot(round=rid, acc=Accumulator(self.dtype, self.numel, "sum"),
                                                 opened=time.monotonic())
        if rank in slot.pushed:
            raise RoundError(f"tensor {self.name!r} outer round {rid}: rank {rank} pushed twice")
        if counts:
            if slot.count:
                slot.acc.add(data)
            else:
                slot.acc.first(data)
            slot.count += 1
        slot.pushed.add(rank)
        slot.waiting.append(waiter)
        if not self.covers(slot.pushed):
            return None
        self.outer_spans = (self.outer_spans + [time.monotonic() - slot.opened])[-OUTER_AUTO_HISTORY:]
        return self._outer_step(rid, slot)

    def reseed(self, rid: int, params: np.ndarray, momentum: np.ndarray | None) -> None:
        """Start this outer key from the state its lost server held after round ``rid``, as the workers kept
        it (the newest any of them had): a retried round ``rid`` is answered with it, round ``rid + 1`` steps
        from it."""
        self.outer.params = params
        self.outer.buf = momentum if self.outer.momentum else None
        self.outer.rounds = rid
        self.outer_done = (rid, to_wire(params, self.dtype))

    def _outer_step(self, rid: int, slot: Slot) -> Slot:
        """Round ``rid`` is complete (every worker pushed, or its deadline passed): one outer step on the mean
        of the pushes it has (none counted: only newcomers pushed before the deadline; the parameters stay)."""
        if slot.count:
            result = to_wire(self.outer.apply(slot.acc.total(), slot.count), self.dtype)
        elif self.outer_done is not None:
            result = self.outer_done[1]
        else:
            raise RoundError(f"tensor {self.name!r}: the start round {rid} had no worker's parameters")
        del self.outer_rounds[rid]
        if self.outer_done is None or rid > self.outer_done[0]:
            self.outer_done = (rid, result)
        slot.out, slot.ready = result, True
        return slot

    def outer_deadline_s(self) -> float | None:
        """How long an outer round may stay open (None: until every worker pushed)."""
        d = self.outer_deadline
        if d is None:
            return None
        if d == "auto":
            if len(self.outer_spans) < OUTER_AUTO_MIN_ROUNDS:
                return None  # no measure yet: the first rounds wait for everyone
            return max(OUTER_AUTO_FLOOR_S, OUTER_AUTO_FACTOR * statistics.median(self.outer_spans))
        return float(d)

    def outer_overdue(self, now: float) -> list[tuple[Slot, list]]:
        """Open rounds past the deadline, completed now with the pushes they have: [(slot, missing ranks)].
        A round exists only once a worker pushed, so none completes with no push."""
        limit = self.outer_deadline_s()
        if limit is None:
            return []
        out = []
        for rid in sorted(self.outer_rounds):
            slot = self.outer_rounds[rid]
            if slot.pushed and (slot.count or self.outer_done is not None) and now - slot.opened > limit:
                missing = sorted(self.expected() - slot.pushed)
                out.append((self._outer_step(rid, slot), missing))
        return out

    def late(self, rnd: int, rank: int) -> Slot | None:
        """Backup keys: the completed round ``rnd``'s slot if ``rank``'s push for it comes too late (it is then
        dropped and counted), else None."""
        if not self.backup:
            return None
        slot = self.slots[rnd % len(self.slots)]
        if slot.round != rnd or not slot.ready or rank in slot.pushed:
            return None
        self.dropped[rank] = self.dropped.get(rank, 0) + 1
        return slot

    def push(self, rnd: int, rank: int, data: np.ndarray, sig: int = 0, offset: int = 0) -> Slot | None:
        """Add one worker's push; returns the slot when the round just completed. Raises
        :class:`Disagreement` when its round signature differs from the others', :class:`Busy` when a
        backup key's slot still waits for a late rank's pull."""
        slot = self._slot_for_push(rnd, rank)
        if slot.error is not None:
            raise Disagreement(slot.error, slot)
        if slot.sigs and sig not in slot.sigs.values():
            slot.error = _disagreement(self.name, {**slot.sigs, rank: sig}, self.expected())
            raise Disagreement(slot.error, slot)
        slot.sigs[rank] = sig
        assert slot.acc is not None
        if self.op == "concat":
            slot.acc.put(data, offset)
        elif not slot.pushed:
            slot.acc.first(data)
        else:
            slot.acc.add(data)
        slot.pushed.add(rank)
        self.pushes += 1
        if self._enough(slot):
            self._fail_if_joined_missing(slot)
            self._complete(slot)
            return slot
        return None

    def _fail_if_joined_missing(self, slot: Slot) -> None:
        """A broadcast round that would complete only because ranks in join() are counted: fail it."""
        absent = sorted(self.joined - slot.pushed) if self.needs_every_rank else []
        if absent:
            slot.error = (f"broadcast of tensor {self.name!r}: rank(s) {absent} called join() and take no part "
                          f"until every rank has joined; a broadcast needs every rank (its root may be among "
                          f"them), so round {slot.round} fails on every rank")
            raise Disagreement(slot.error, slot)

    def _enough(self, slot: Slot) -> bool:
        """Every rank this key waits for pushed or joined (its writers, with the local reduce); with backup
        workers, all but ``backup`` of them (and one at least)."""
        if not slot.pushed:
            return False
        if self.writers is not None:
            return self.covers(slot.pushed)
        if not self.joined:
            return len(slot.pushed) >= self.num_workers - self.backup
        return len(slot.pushed | self.joined) >= self.num_workers - self.backup

    def _shared_acc(self, index: int) -> np.ndarray | None:
        """Slot ``index``'s shared output as the accumulator, where the sum is kept in the wire dtype."""
        region = self.shm
        if region is None or ACC_NP[self.dtype] is not WIRE_NP[self.dtype]:
            return None
        return region.out(index).view(WIRE_NP[self.dtype])

    def _complete(self, slot: Slot) -> None:
        result = slot.acc.result()
        region = self.shm
        if region is not None:  # the sum goes to the shared output (the only push, or a rounded fp16 sum)
            out = region.out(slot.round % len(self.slots)).view(result.dtype)
            if result.ctypes.data != out.ctypes.data:
                np.copyto(out, result)
            result = out
        slot.out = self.codec.compress_sum(result) if self.codec is not None else result
        slot.count = len(slot.pushed)
        slot.ready = True
        self.completed = max(self.completed, slot.round)
        self.round_s += time.monotonic() - slot.opened  # first push to the sum: the metrics' round latency
        self.rounds_timed += 1

    def complete_without_joined(self) -> list:
        """Rounds that only waited for ranks that have joined since: complete them now (join())."""
        done = []
        for slot in self.slots:
            if slot.round != -1 and not slot.ready and slot.error is None and self._enough(slot):
                try:
                    self._fail_if_joined_missing(slot)
                except Disagreement:
                    done.append(slot)  # slot.error says why: its waiting pulls get it
                    continue
                self._complete(slot)
                done.append(slot)
        return done

    def pull(self, rnd: int, rank: int) -> Slot:
        slot = self.slots[rnd % len(self.slots)]
        if slot.round != rnd:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pulled round {rnd} before pushing it")
        if slot.error is not None:
            raise Disagreement(slot.error, slot)
        if rank in slot.asked:
            raise RoundError(f"tensor {self.name!r} round {rnd}: rank {rank} pulled twice")
        slot.asked.add(rank)
        return slot
