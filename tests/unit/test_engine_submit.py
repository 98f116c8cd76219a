"""The engine's submit() on the training thread against a change of the job applied on the I/O thread
(pushpull.worker.engine: _take_entry, _reset), on an engine without sockets. The race these pin down ended a
CI run: a worker whose op took the new generation before the change was marked unseen pushed the tensor again
after its restore and was told the tensor was already in flight (tests/cluster/test_elastic.py's replacement
job)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from pushpull import dtypes
from pushpull.config import load_config
from pushpull.worker.average import Averager
from pushpull.worker.direct_call import DirectCalls
from pushpull.worker.engine import Engine
from pushpull.worker.handle import PushPullError, WorkersChanged
from pushpull.worker.table import PLAIN, READY, TensorTable, new_stats

SHAPE = (4,)


def _engine(gen: int = 1, timeout: float = 5.0) -> Engine:
    eng = Engine.__new__(Engine)
    eng.cfg = load_config({"PUSHPULL_TIMEOUT": str(timeout)})
    eng.table = TensorTable()
    eng.stats = new_stats()
    eng.kv = SimpleNamespace(gen=gen, rank=0)
    eng.pipeline = SimpleNamespace(changed_reason="the job changed (a test): 2 workers", restarts=[])
    eng.member = SimpleNamespace(failure=None, node_id=0)
    eng.changed_unseen = False
    return eng


def _take(eng: Engine):
    return eng._take_entry("t", SHAPE, dtypes.BY_NAME["float32"], None, PLAIN)


def test_a_free_tensor_is_marked_busy_in_the_generation_now():
    eng = _engine(gen=3)
    gen, entry = _take(eng)
    assert gen == 3 and entry.busy and entry.busy_gen == 3


def test_a_second_op_of_a_tensor_in_flight_in_the_same_generation_is_refused_naming_it():
    eng = _engine()
    _take(eng)
    with pytest.raises(ValueError, match="'t' is already in flight"):
        _take(eng)


def test_an_op_from_before_a_change_is_waited_for_until_the_io_thread_fails_it():
    eng = _engine(gen=1)
    _, entry = _take(eng)
    eng.kv.gen = 2  # the change came; the caller already had WorkersChanged from another tensor and restored

    def io_thread_fails_the_old_op():
        time.sleep(0.1)
        entry.busy = False  # Pipeline.finish, as start() or restart() fail the op
    threading.Thread(target=io_thread_fails_the_old_op).start()
    t0 = time.monotonic()
    gen, again = _take(eng)
    assert gen == 2 and again is entry and entry.busy_gen == 2 and time.monotonic() - t0 >= 0.09


def test_an_op_from_before_a_change_never_released_is_a_timeout_naming_the_tensor():
    eng = _engine(gen=1, timeout=1)
    _take(eng)
    eng.kv.gen = 2
    t0 = time.monotonic()
    with pytest.raises(PushPullError, match=r"tensor 't'.*still in flight after 1s \(PUSHPULL_TIMEOUT\)"):
        _take(eng)
    assert time.monotonic() - t0 < 3


def test_a_change_not_yet_seen_raises_workers_changed_before_anything_is_marked():
    eng = _engine()
    eng.changed_unseen = True
    with pytest.raises(WorkersChanged, match="tensor 't'"):
        _take(eng)
    assert "t" not in eng.table.entries and not eng.changed_unseen


def _resettable(first_rank: int = 0) -> Engine:
    """An engine whose _reset() can run: the collaborators it calls record what they are given."""
    eng = _engine(gen=1)
    eng.first_rank = first_rank
    eng.servers_lost = set()
    eng.averager = Averager(3)
    eng.on_reset = []
    eng.arrival_gen = 0
    eng.member.fail = lambda why: setattr(eng.member, "failure", why)
    eng.pipeline.restart = lambda reason, moved, keep: eng.pipeline.restarts.append((reason, eng.changed_unseen))
    return eng


def test_a_change_takes_the_generation_and_marks_itself_unseen_in_one_step_under_the_table_lock():
    """A submit reads both under the table's lock: while it holds the lock, the change waits whole."""
    eng = _resettable()
    change = {"gen": 2, "num_workers": 2, "ranks": {"0": 0}, "lost": "worker rank 1 failed"}
    with eng.table.lock:
        io = threading.Thread(target=eng._reset, args=(change,))
        io.start()
        time.sleep(0.1)
        assert eng.kv.gen == 1 and not eng.changed_unseen and eng.size == 3
    io.join(5)
    assert eng.kv.gen == 2 and eng.changed_unseen and eng.size == 2
    assert eng.pipeline.restarts == [("the job changed (worker rank 1 failed): 2 workers, this one is rank 0 now "
                                      "(generation 2)", True)]


def test_the_end_of_a_join_is_no_change_to_restore_from():
    eng = _resettable()
    eng.joined_ranks, eng._join_done = {1}, threading.Event()
    eng._reset({"gen": 2, "num_workers": 3, "ranks": {"0": 0, "1": 1, "2": 2}, "joined_last": 1})
    assert eng.kv.gen == 2 and not eng.changed_unseen and eng._join_last == 1 and eng._join_done.is_set()


def test_an_op_of_a_tensor_submitted_after_the_change_raises_and_its_next_one_goes_on():
    eng = _resettable()
    eng._reset({"gen": 2, "num_workers": 2, "ranks": {"0": 0}, "lost": "worker rank 1 failed"})
    with pytest.raises(WorkersChanged, match=r"generation 2"):
        _take(eng)
    gen, entry = _take(eng)
    assert gen == 2 and entry.busy and entry.busy_gen == 2


class _Watched(Engine):
    """An engine that records, each time a change is marked unseen, which arrival it knew of then."""

    marks: list

    @property
    def changed_unseen(self):
        return self._unseen

    @changed_unseen.setter
    def changed_unseen(self, value):
        self._unseen = value
        if value:
            self.marks.append(self.arrival_gen)


def test_a_change_that_brought_a_worker_in_is_known_before_the_change_is_marked():
    """Whoever catches the change's WorkersChanged reads arrival_gen to welcome the newcomer (DiLoCo); a
    catcher that read it before it was set went on without the welcome the others waited for (a replacement
    test's 30 s timeout)."""
    eng = _resettable()
    watched = _Watched.__new__(_Watched)
    watched.__dict__.update({k: v for k, v in eng.__dict__.items() if k != "changed_unseen"})
    watched._unseen, watched.marks = False, []
    watched._reset({"gen": 2, "num_workers": 3, "ranks": {"0": 0}, "lost": "a late worker came in as rank 2",
                    "came_in": True})
    assert watched.marks == [2] and watched.arrival_gen == 2


def test_a_direct_call_that_a_change_cuts_off_leaves_its_tensor_at_round_0_for_the_new_job():
    """The direct path counts its round after it took the generation; a change's restart (zeroing every tensor's
    round on the I/O thread) could land before that count, and the tensor would run one round ahead of the other
    workers in the new job, its next call timing out."""
    eng = _engine(gen=1)
    entry = eng.table.entry("t", SHAPE, dtypes.BY_NAME["float32"], None, PLAIN, eng.cfg)
    entry.state, entry.round = READY, 1  # the restart below ran before this call counted its round: it says 2

    def exchange(sock, header, payload, timeout, alive):
        eng.kv.gen = 2  # the change: the server drops the old generation's push and the wait sees it
        raise ConnectionError(alive())
    eng.direct = SimpleNamespace(closed=False, exchange=exchange)
    eng.pipeline.tracer = None
    eng.averager = Averager(2)
    with pytest.raises(WorkersChanged):
        DirectCalls(eng).push_pull_now(np.ones(SHAPE, np.float32), None, "t", True)
    assert entry.round == 0 and not entry.busy
