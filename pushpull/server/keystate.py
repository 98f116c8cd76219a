"""Per-key round state on a server, double-buffered.

Round r lives in slot r % 2. A slot is reused for round r + 2 only after every
worker pulled round r, so a fast worker's next push can never overwrite a sum a
slow worker has not pulled yet (a defect of BytePS). Protocol misuse (a push two
rounds ahead, a duplicate push, a pull before one's push) is reported, not
silently mis-summed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pushpull.server.reduce import WIRE_NP, Accumulator, Concat
from pushpull.transport.protocol import describe_sig


class RoundError(ValueError):
    pass


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
    inline: bool = False  # small: summed on the receiving thread, a hand-off costs more than the sum
    op: str = "sum"  # sum | min | max | product | concat
    readers: frozenset | None = None  # ranks that receive the result (None: all); the others get an empty body
    wire_nbytes: int = field(init=False)  # bytes of an uncompressed push (checked on every push)
    joined: set = field(default_factory=set)  # ranks that called join(): the server's set, shared
    # the ranks that push this key (None: every worker). With the local reduce each machine's processes
    # reduce together first and one of them pushes each slice, so a slice's key has one pusher per machine
    writers: frozenset | None = None

    def __post_init__(self) -> None:
        self.wire_nbytes = self.numel * np.dtype(WIRE_NP[self.dtype]).itemsize

    def covers(self, ranks: set) -> bool:
        """Whether ``ranks`` (with those that joined) are every rank this key waits for."""
        if self.writers is None:
            return len(ranks | self.joined) >= self.num_workers
        return self.writers <= (ranks | self.joined)

    def expected(self) -> set:
        return set(self.writers) if self.writers is not None else set(range(self.num_workers))

    def reset(self, num_workers: int) -> None:
        """A new generation of workers (elastic): no round survives, ``num_workers`` push each one now.
        New slots, so an engine thread still summing an old push writes into a slot nobody reads."""
        self.num_workers = num_workers
        self.slots = [Slot(), Slot()]
        if self.codec is not None and hasattr(self.codec, "reset"):
            self.codec.reset()

    def _slot_for_push(self, rnd: int, rank: int) -> Slot:
        if self.writers is not None and rank not in self.writers:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pushed round {rnd}, but only rank(s) "
                             f"{sorted(self.writers)} push this key")
        slot = self.slots[rnd % 2]
        if slot.round == rnd:
            if rank in slot.pushed:
                raise RoundError(f"tensor {self.name!r} round {rnd}: rank {rank} pushed twice")
            return slot
        if slot.round == -1 or (slot.round == rnd - 2 and self.covers(slot.pulled)):
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
            if slot.acc is None:
                slot.acc = Concat(self.numel) if self.op == "concat" else Accumulator(self.dtype, self.numel, self.op)
            return slot
        missing = sorted(self.expected() - slot.pulled)
        raise RoundError(f"tensor {self.name!r}: rank {rank} pushed round {rnd} while round {slot.round} "
                         f"has not been pulled by rank(s) {missing}")

    def abort(self, rnd: int, rank: int, error: str) -> None:
        """Rank ``rank`` cannot take part in round ``rnd``: the round fails on every rank with ``error``."""
        slot = self._slot_for_push(rnd, rank)
        if slot.error is None:
            slot.error = error
        raise Disagreement(slot.error, slot)

    def push(self, rnd: int, rank: int, data: np.ndarray, sig: int = 0, offset: int = 0) -> Slot | None:
        """Add one worker's push; returns the slot when the round just completed. Raises
        :class:`Disagreement` when its round signature differs from the others'."""
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
        if self.covers(slot.pushed):
            self._complete(slot)
            return slot
        return None

    def _complete(self, slot: Slot) -> None:
        result = slot.acc.result()
        slot.out = self.codec.compress_sum(result) if self.codec is not None else result
        slot.ready = True

    def complete_without_joined(self) -> list:
        """Rounds that only waited for ranks that have joined since: complete them now (join())."""
        done = []
        for slot in self.slots:
            if (slot.round != -1 and not slot.ready and slot.error is None and slot.pushed
                    and self.covers(slot.pushed)):
                self._complete(slot)
                done.append(slot)
        return done

    def pull(self, rnd: int, rank: int) -> Slot:
        slot = self.slots[rnd % 2]
        if slot.round != rnd:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pulled round {rnd} before pushing it")
        if slot.error is not None:
            raise Disagreement(slot.error, slot)
        if rank in slot.asked:
            raise RoundError(f"tensor {self.name!r} round {rnd}: rank {rank} pulled twice")
        slot.asked.add(rank)
        return slot
