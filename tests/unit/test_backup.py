"""Backup workers (PUSHPULL_BACKUP_WORKERS, Chen et al. 2016): a round of a backup key completes with the
first n - b pushes, a late push is dropped and counted, every rank gets the same sum, and a straggler
catches up. Here the round logic without processes (KeyState); a real job under the launcher:
tests/cluster/test_backup.py."""
from __future__ import annotations

import numpy as np
import pytest

from pushpull.server.keystate import Busy, KeyState, RoundError
from pushpull.transport.protocol import backup_extra, split_backup_extra


def _ks(n=3, b=1, depth=4) -> KeyState:
    ks = KeyState(5, "Gradient.w", "float32", 2, n)
    ks.use_backup(b, depth)
    return ks


def _x(v) -> np.ndarray:
    return np.full(2, v, np.float32)


def _finish(ks: KeyState, rnd: int, ranks) -> None:
    """Every rank in ``ranks`` pulls round ``rnd`` (what a worker does after pushing)."""
    for r in ranks:
        ks.pull(rnd, r).pulled.add(r)


def test_a_round_completes_with_the_first_n_minus_b_pushes():
    ks = _ks()
    assert ks.push(1, 0, _x(1)) is None
    assert ks.push(1, 1, _x(2)) is not None


def test_the_sum_holds_exactly_the_first_pushes_and_says_how_many():
    ks = _ks(n=4, b=2)
    ks.push(1, 3, _x(8))
    slot = ks.push(1, 1, _x(2))
    assert (slot.out.tolist(), slot.count) == ([10.0, 10.0], 2)


def test_a_late_push_is_dropped_and_counted_per_rank():
    ks = _ks()
    ks.push(1, 0, _x(1))
    slot = ks.push(1, 1, _x(2))
    assert ks.late(1, 2) is slot and ks.dropped == {2: 1} and slot.out.tolist() == [3.0, 3.0]


def test_the_late_rank_pulls_the_same_sum_as_the_others():
    ks = _ks()
    ks.push(1, 0, _x(1))
    ks.push(1, 1, _x(2))
    ks.late(1, 2)
    assert ks.pull(1, 2).out is ks.pull(1, 0).out


def test_a_late_push_for_round_r_is_not_mixed_into_round_r_plus_1():
    ks = _ks()
    ks.push(1, 0, _x(1))
    ks.push(1, 1, _x(2))
    _finish(ks, 1, [0, 1])
    ks.push(2, 0, _x(4))  # round 2 has begun when rank 2's push for round 1 arrives
    assert ks.late(1, 2).round == 1
    assert ks.push(2, 1, _x(16)).out.tolist() == [20.0, 20.0]


def test_a_push_for_a_round_not_yet_completed_is_not_late():
    ks = _ks()
    ks.push(1, 0, _x(1))
    assert ks.late(1, 2) is None and ks.dropped == {}


def test_a_push_beyond_the_kept_rounds_waits_for_the_late_rank():
    ks = _ks(depth=2)
    for rnd in (1, 2):
        ks.push(rnd, 0, _x(1))
        ks.push(rnd, 1, _x(1))
        _finish(ks, rnd, [0, 1])
    with pytest.raises(Busy):
        ks.push(3, 0, _x(1))  # round 1's slot: rank 2 has not pulled round 1


def test_the_waiting_push_goes_once_the_late_rank_pulled():
    ks = _ks(depth=2)
    for rnd in (1, 2):
        ks.push(rnd, 0, _x(1))
        ks.push(rnd, 1, _x(1))
        _finish(ks, rnd, [0, 1])
    _finish(ks, 1, [2])
    assert ks.push(3, 0, _x(1)) is None and ks.slots[1].round == 3


def test_a_joined_rank_counts_as_present():
    ks = _ks(n=3, b=1)
    ks.joined = {2}
    assert ks.push(1, 0, _x(1)).count == 1


def test_without_backup_a_round_waits_for_every_push():
    ks = KeyState(5, "Gradient.w", "float32", 2, 3)
    ks.push(1, 0, _x(1))
    assert ks.push(1, 1, _x(2)) is None and ks.late(1, 2) is None


def test_a_rank_cannot_push_past_a_round_it_has_not_pulled():
    ks = _ks(depth=2)
    ks.push(1, 0, _x(1))
    ks.push(1, 1, _x(1))
    with pytest.raises(RoundError, match="before pulling round 1"):
        ks.push(3, 0, _x(1))


def test_the_pull_answer_carries_the_count_and_the_rounds_ahead():
    assert split_backup_extra(backup_extra(3, 7)) == (3, 7)


@pytest.mark.parametrize("backup", [3, -1])
def test_backup_workers_must_be_fewer_than_the_workers(backup):
    from pushpull.server.declare import backup_problem

    problem = backup_problem(backup, {"name": "Gradient.w", "op": "sum", "compression": None}, 3)
    assert f"PUSHPULL_BACKUP_WORKERS={backup}" in problem and "from 0 to 2" in problem


def test_a_round_open_over_the_limit_names_the_ranks_it_waits_for():
    """The metrics' late and missing ranks (pushpull_server_rounds_awaiting): rank 2 of 3 has not pushed."""
    ks = KeyState(5, "Gradient.w", "float32", 2, 3)
    ks.push(1, 0, np.ones(2, np.float32))
    ks.push(1, 1, np.ones(2, np.float32))
    opened = next(s for s in ks.slots if s.round == 1).opened
    assert ks.awaited(1.0, opened + 0.5) == []  # not open long enough yet
    assert ks.awaited(1.0, opened + 2.0) == [2]
