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

from pushpull.server.reduce import WIRE_NP, Accumulator


class RoundError(ValueError):
    pass


@dataclass
class Slot:
    round: int = -1
    pushed: set = field(default_factory=set)
    pulled: set = field(default_factory=set)
    asked: set = field(default_factory=set)  # ranks that pulled this round, answered or waiting
    waiting: list = field(default_factory=list)  # (identity, rank, req_id) pulls before the round completed
    acc: Accumulator | None = None
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
    wire_nbytes: int = field(init=False)  # bytes of an uncompressed push (checked on every push)

    def __post_init__(self) -> None:
        self.wire_nbytes = self.numel * np.dtype(WIRE_NP[self.dtype]).itemsize

    def reset(self, num_workers: int) -> None:
        """A new generation of workers (elastic): no round survives, ``num_workers`` push each one now.
        New slots, so an engine thread still summing an old push writes into a slot nobody reads."""
        self.num_workers = num_workers
        self.slots = [Slot(), Slot()]
        if self.codec is not None and hasattr(self.codec, "reset"):
            self.codec.reset()

    def _slot_for_push(self, rnd: int, rank: int) -> Slot:
        slot = self.slots[rnd % 2]
        if slot.round == rnd:
            if rank in slot.pushed:
                raise RoundError(f"tensor {self.name!r} round {rnd}: rank {rank} pushed twice")
            return slot
        if slot.round == -1 or (slot.round == rnd - 2 and len(slot.pulled) == self.num_workers):
            slot.round = rnd
            slot.pushed.clear()
            slot.pulled.clear()
            slot.asked.clear()
            slot.waiting.clear()
            slot.ready = False
            slot.out = None
            slot.wire = None
            if slot.acc is None:
                slot.acc = Accumulator(self.dtype, self.numel)
            return slot
        missing = sorted(set(range(self.num_workers)) - slot.pulled)
        raise RoundError(f"tensor {self.name!r}: rank {rank} pushed round {rnd} while round {slot.round} "
                         f"has not been pulled by rank(s) {missing}")

    def push(self, rnd: int, rank: int, data: np.ndarray) -> Slot | None:
        """Add one worker's push; returns the slot when the round just completed."""
        slot = self._slot_for_push(rnd, rank)
        assert slot.acc is not None
        if not slot.pushed:
            slot.acc.first(data)
        else:
            slot.acc.add(data)
        slot.pushed.add(rank)
        if len(slot.pushed) == self.num_workers:
            result = slot.acc.result()
            slot.out = self.codec.compress_sum(result) if self.codec is not None else result
            slot.ready = True
            return slot
        return None

    def pull(self, rnd: int, rank: int) -> Slot:
        slot = self.slots[rnd % 2]
        if slot.round != rnd:
            raise RoundError(f"tensor {self.name!r}: rank {rank} pulled round {rnd} before pushing it")
        if rank in slot.asked:
            raise RoundError(f"tensor {self.name!r} round {rnd}: rank {rank} pulled twice")
        slot.asked.add(rank)
        return slot
