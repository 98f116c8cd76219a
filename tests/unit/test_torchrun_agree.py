"""How the ranks of one torchrun rendezvous round agree on the pushpull job's address through torchrun's store
(pushpull.launch.torchrun.agree_job), with the store as a dict: the last round's keys must never be read."""
from __future__ import annotations

import datetime
import threading
import time

import pytest

from pushpull.launch.torchrun import agree_job


class DictStore:
    """TCPStore's calls agree_job makes: set, get (blocks), check, wait (blocks, with a timeout)."""

    def __init__(self):
        self.d: dict[str, bytes] = {}
        self.lock = threading.Condition()

    def set(self, key, value):
        with self.lock:
            self.d[key] = value.encode() if isinstance(value, str) else value
            self.lock.notify_all()

    def get(self, key):
        with self.lock:
            self.lock.wait_for(lambda: key in self.d, timeout=10)
            return self.d[key]

    def check(self, keys):
        with self.lock:
            return all(k in self.d for k in keys)

    def wait(self, keys, timeout: datetime.timedelta):
        with self.lock:
            if not self.lock.wait_for(lambda: all(k in self.d for k in keys), timeout=timeout.total_seconds()):
                raise RuntimeError(f"wait timeout: {keys}")


def _round(store, world: int, port: int, secret: str, delays: dict[int, float]) -> dict[int, tuple]:
    got: dict[int, tuple] = {}

    def rank(r):
        time.sleep(delays.get(r, 0.0))
        got[r] = agree_job(store, "pushpull/job/", r, world, lambda: (port, secret), timeout=5)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return got


def test_every_rank_gets_rank_0s_choice():
    got = _round(DictStore(), 3, 4100, "s1", {})
    assert got == {0: (4100, "s1"), 1: (4100, "s1"), 2: (4100, "s1")}


def test_a_later_round_in_the_same_store_never_reads_the_last_rounds_answer():
    """The store outlives a round: rank 1 of round 2 asks before round 2's rank 0 has started, while round 1's
    question and answer are still in the store."""
    store = DictStore()
    assert _round(store, 2, 4100, "old", {})[1] == (4100, "old")
    got = _round(store, 2, 4200, "new", {0: 0.3})  # rank 0 late: rank 1 finds only the old round's keys
    assert got == {0: (4200, "new"), 1: (4200, "new")}


def test_rank_0_names_the_ranks_that_never_asked():
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1, 2\] did not read"):
        agree_job(DictStore(), "pushpull/job/", 0, 3, lambda: (1, "s"), timeout=0.3)
