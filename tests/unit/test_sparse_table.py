"""The server's sparse table alone (no processes): its Adagrad matches torch.optim.Adagrad on the dense table."""
from __future__ import annotations

import numpy as np
import torch

from pushpull.server.sparse import SparseTable


def test_adagrad_on_the_touched_rows_matches_torch_adagrad_on_the_dense_table():
    rows, dim, workers, lr = 10, 4, 2, 0.3
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(rows, dim, generator=gen)
    dense = torch.nn.Parameter(start.clone())
    opt = torch.optim.Adagrad([dense], lr=lr, eps=1e-10, initial_accumulator_value=0.1)
    table = SparseTable(1, "t", rows, dim, 0, rows, {"name": "adagrad", "eps": 1e-10,
                                                     "initial_accumulator_value": 0.1}, workers)
    table.set_rows(np.arange(rows), start.numpy())
    for rnd in range(1, 6):
        total = torch.zeros(rows, dim)
        for rank in range(workers):
            ids = torch.unique(torch.randint(0, rows, (4,), generator=gen))
            g = torch.randn(len(ids), dim, generator=gen)
            total.index_add_(0, ids, g)
            done = table.push(rnd, rank, ids.numpy(), g.numpy(), lr)
        assert done == [rnd]
        dense.grad = total / workers
        opt.step()
    np.testing.assert_allclose(table.read(np.arange(rows)), dense.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_pull_whose_answer_would_not_fit_in_a_message_is_refused_before_reading_rows():
    from pushpull.config import load_config
    from pushpull.server.sparse import SparseStore
    from pushpull.transport.protocol import Header, Msg, MsgType, encode_json

    cfg = load_config({"PUSHPULL_MAX_MESSAGE_BYTES": str(1 << 20), "BYTEPS_PARTITION_BYTES": "65536"})
    errors, replies = [], []
    store = SparseStore(cfg, lambda ident, h, frames=(): replies.append(h),
                        lambda ident, key, text, req_id=0: errors.append(text), lambda: 0)
    store.num_workers = 1
    decl = {"name": "t", "rows": 100_000, "dim": 64, "lo": 0, "hi": 100_000, "optimizer": {"name": "sgd"}}
    store.handle(b"w0", Msg(Header(MsgType.SPARSE_INIT, sender=0, key=7), [encode_json(decl)]))
    assert not errors and replies[-1].type == MsgType.SPARSE_ACK
    n = 5000  # 5000 x 64 x 4 = 1.28 MB of rows for 40 KB of ids
    store.handle(b"w0", Msg(Header(MsgType.SPARSE_PULL, sender=0, key=7, numel=n),
                            [np.arange(n, dtype=np.int64).tobytes()]))
    assert errors and "asks for 5000 rows, 1280000 bytes, over PUSHPULL_MAX_MESSAGE_BYTES=1048576" in errors[-1]


def _store(max_message_bytes: int = 1 << 20, workers: int = 2):
    from pushpull.config import load_config
    from pushpull.server.sparse import SparseStore

    cfg = load_config({"PUSHPULL_MAX_MESSAGE_BYTES": str(max_message_bytes), "BYTEPS_PARTITION_BYTES": "65536"})
    errors, replies = [], []
    store = SparseStore(cfg, lambda ident, h, frames=(): replies.append((ident, h, list(frames))),
                        lambda ident, key, text, req_id=0: errors.append(text), lambda: 0)
    store.num_workers = workers
    return store, replies, errors


def _declare(store, optimizer="sgd", rows=10, lo=0, hi=10, workers=2, elastic=True):
    from pushpull.transport.protocol import Header, Msg, MsgType, encode_json

    decl = {"name": "t", "rows": rows, "dim": 2, "lo": lo, "hi": hi, "optimizer": {"name": optimizer},
            "elastic": elastic}
    for rank in range(workers):
        store.handle(b"w%d" % rank, Msg(Header(MsgType.SPARSE_INIT, sender=rank, key=7), [encode_json(decl)]))


def _push(store, rank, rnd, ids, grads):
    from pushpull.transport.protocol import Flags, Header, Msg, MsgType, dtype_code, f32_bits

    ids = np.asarray(ids, np.int64)
    g = np.asarray(grads, np.float32).reshape(len(ids), 2)
    store.handle(b"w%d" % rank, Msg(Header(MsgType.SPARSE_PUSH, sender=rank, key=7, round=rnd, numel=len(ids),
                                           dtype=dtype_code("float32"), extra=f32_bits(1.0), flags=Flags.NO_ACK),
                                    [ids.tobytes(), g.tobytes()]))


def _pull_changed(store, rank, rnd, lo, hi, since):
    from pushpull.transport.protocol import Flags, Header, Msg, MsgType

    store.handle(b"w%d" % rank, Msg(Header(MsgType.SPARSE_PULL, sender=rank, key=7, round=rnd, flags=Flags.CHANGED,
                                           extra=since + 1 if since >= 0 else 0),
                                    [np.array([lo, hi], np.int64).tobytes()]))


def _changed_answer(replies):
    from pushpull.transport.protocol import Flags

    _, h, frames = replies[-1]
    assert h.flags & Flags.CHANGED
    return [np.frombuffer(bytes(f), dtype=d) for f, d in zip(frames, ("<i8", "<f4", "<f4"))]


def test_a_pull_of_changed_rows_answers_only_the_rows_a_round_after_since_changed():
    store, replies, errors = _store()
    _declare(store)
    _push(store, 0, 1, [2, 5], [[1, 1], [1, 1]])
    _push(store, 1, 1, [5], [[3, 3]])           # round 1 changes rows 2 and 5
    _push(store, 0, 2, [7], [[2, 2]])
    _push(store, 1, 2, [], [])                  # round 2 changes row 7
    _pull_changed(store, 0, 2, 0, 10, since=1)
    ids, rows = _changed_answer(replies)[:2]
    assert not errors and ids.tolist() == [7] and rows.tolist() == [-1.0, -1.0]  # the average of 2 and nothing


def test_a_pull_of_changed_rows_since_minus_one_answers_every_row_of_the_range():
    store, replies, errors = _store()
    _declare(store)
    _pull_changed(store, 0, 0, 3, 6, since=-1)
    assert not errors and _changed_answer(replies)[0].tolist() == [3, 4, 5]


def test_a_pull_of_changed_rows_waits_for_its_round_then_answers_it():
    store, replies, errors = _store()
    _declare(store)
    _push(store, 0, 1, [4], [[2, 2]])
    n = len(replies)
    _pull_changed(store, 0, 1, 0, 10, since=0)  # round 1 is not applied yet: rank 1 has not pushed it
    assert len(replies) == n
    _push(store, 1, 1, [], [])
    assert not errors and _changed_answer(replies)[0].tolist() == [4]


def test_an_adagrad_tables_changed_rows_come_with_their_accumulators():
    store, replies, errors = _store()
    _declare(store, optimizer="adagrad")
    _push(store, 0, 1, [1], [[2, 2]])
    _push(store, 1, 1, [1], [[2, 2]])
    _pull_changed(store, 0, 1, 0, 10, since=0)
    ids, _, acc = _changed_answer(replies)
    assert not errors and ids.tolist() == [1] and acc.tolist() == [4.0, 4.0]  # 0 + the mean gradient squared


def test_a_pull_of_changed_rows_outside_the_servers_range_is_refused_naming_it():
    store, replies, errors = _store()
    _declare(store, rows=20, lo=0, hi=10)
    _pull_changed(store, 0, 0, 5, 15, since=-1)
    assert errors and "pull of changed rows asked for rows [5, 15), this server holds [0, 10)" in errors[-1]


def test_a_pull_of_changed_rows_that_could_overflow_a_message_is_refused():
    store, replies, errors = _store()
    _declare(store, rows=100_000, lo=0, hi=100_000)  # 100,000 x (8 + 2 x 4) bytes: 1.6 MB
    _pull_changed(store, 0, 0, 0, 100_000, since=-1)
    assert errors and "over PUSHPULL_MAX_MESSAGE_BYTES=1048576" in errors[-1]


def test_a_load_writes_an_adagrad_tables_accumulators_too():
    from pushpull.transport.protocol import Flags, Header, Msg, MsgType, dtype_code

    store, replies, errors = _store()
    _declare(store, optimizer="adagrad")
    ids, vals, acc = np.array([3], np.int64), np.full((1, 2), 5, np.float32), np.full((1, 2), 9, np.float32)
    store.handle(b"w0", Msg(Header(MsgType.SPARSE_PUSH, sender=0, key=7, round=1, numel=1, flags=Flags.SET,
                                   dtype=dtype_code("float32")), [ids.tobytes(), vals.tobytes(), acc.tobytes()]))
    t = store.tables[7]
    assert not errors and t.weight[3].tolist() == [5, 5] and t.accum[3].tolist() == [9, 9]


def test_a_change_in_an_elastic_job_drops_every_table_for_the_workers_to_declare_again():
    store, replies, errors = _store()
    _declare(store)
    store.drop_all()
    assert not store.tables and not store.owns(7)


def test_the_load_plan_covers_every_row_from_the_lowest_rank_reaching_furthest():
    from pushpull.torch.sparse import _cover

    # 3 old shards of 30 rows, kept twice over: ranks 0 and 1 survive, rank 2 (a newcomer) holds nothing
    assert _cover(30, [[[0, 10], [10, 20]], [[10, 20], [20, 30]], []]) == [(0, 20, 0), (20, 30, 1)]


def test_the_load_plan_names_the_rows_no_rank_holds():
    from pushpull.torch.sparse import _cover

    assert _cover(30, [[[0, 10]], [[20, 30]]]) == "[10, 20)"


def test_a_pull_of_changed_rows_of_a_table_outside_an_elastic_job_is_refused():
    store, replies, errors = _store()
    _declare(store, elastic=False)
    _pull_changed(store, 0, 0, 0, 10, since=-1)
    assert errors and "declared outside an elastic job" in errors[-1] and store.tables[7].touched is None


def test_changed_rows_cannot_be_asked_again_and_again_in_one_round():
    store, replies, errors = _store()
    _declare(store)
    for _ in range(2):  # a worker takes its shards whole (10 rows), then commits twice in the same round (none)
        _pull_changed(store, 0, 0, 0, 10, since=-1 if not _ else 0)
    _pull_changed(store, 0, 0, 0, 10, since=0)
    assert not errors
    _pull_changed(store, 0, 0, 0, 10, since=-1)  # 20 rows: twice the range, still answered
    assert not errors
    _pull_changed(store, 0, 0, 0, 10, since=-1)
    assert errors and "rank 0 asked for 30 changed rows in round 0, more than twice this server's 10" in errors[-1]


def test_a_pull_of_changed_rows_of_a_past_round_is_refused():
    store, replies, errors = _store()
    _declare(store)
    _push(store, 0, 1, [], [])
    _push(store, 1, 1, [], [])
    _pull_changed(store, 0, 0, 0, 10, since=-1)
    assert errors and "as of round 0, the table is at round 1" in errors[-1]


def test_an_elastic_tables_rounds_per_row_count_against_the_servers_byte_limit():
    from pushpull.server.sparse import _rows_bytes

    # the rows and their rounds, and room for a commit's snapshot of every row (slot; values and round, grown
    # by doubling: 1.5 times while it grows)
    assert _rows_bytes(100, 1, "sgd", elastic=True) == 100 * 4 + 100 * 4 + 100 * 4 + 100 * (4 + 4) * 3 // 2
    assert _rows_bytes(100, 1, "sgd") == 100 * 4


def _copy_step(store, rank, step, rnd, lo=0, hi=10, since=-1):
    from pushpull.transport.protocol import COPY_READ, Header, Msg, MsgType

    body = [np.array([lo, hi], np.int64).tobytes()] if step == COPY_READ else []
    store.handle(b"w%d" % rank, Msg(Header(MsgType.SPARSE_COPY, sender=rank, key=7, round=rnd, numel=step,
                                           extra=since + 1 if since >= 0 else 0), body))


def _two_rounds_then_a_copy_of_round_2(store, optimizer="sgd"):
    """Rounds 1 (row 2) and 2 (row 5), then both ranks open the copy of round 2."""
    from pushpull.transport.protocol import COPY_OPEN

    _declare(store, optimizer=optimizer)
    _push(store, 0, 1, [2], [[1, 1]])
    _push(store, 1, 1, [], [])
    _push(store, 0, 2, [5], [[2, 2]])
    _push(store, 1, 2, [], [])
    for rank in (0, 1):
        _copy_step(store, rank, COPY_OPEN, 2)


def test_a_commits_copy_reads_the_rows_as_of_its_round_after_later_rounds_changed_them():
    from pushpull.transport.protocol import COPY_READ

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    _push(store, 0, 3, [5, 8], [[10, 10], [4, 4]])  # round 3 changes rows 5 and 8 while the copy is read
    _push(store, 1, 3, [], [])
    _copy_step(store, 0, COPY_READ, 2, since=1)
    ids, rows = _changed_answer(replies)[:2]
    # row 5 as round 2 left it (-1), not round 3's -6; row 8 changed after the copy's round, so not in it
    assert not errors and ids.tolist() == [5] and rows.tolist() == [-1.0, -1.0]


def test_a_commits_copy_keeps_only_the_rows_later_rounds_change():
    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    _push(store, 0, 3, [5, 8], [[10, 10], [4, 4]])
    _push(store, 1, 3, [8], [[4, 4]])
    snap = store.tables[7].snapshot
    assert not errors and np.flatnonzero(snap.slot >= 0).tolist() == [5, 8] and snap.size == 2


def test_a_read_of_a_copy_whose_round_is_not_applied_waits_for_it():
    from pushpull.transport.protocol import COPY_OPEN, COPY_READ

    store, replies, errors = _store()
    _declare(store)
    _push(store, 0, 1, [4], [[2, 2]])
    _copy_step(store, 0, COPY_OPEN, 1)  # rank 0 committed after its push of round 1; rank 1 has not pushed it
    _copy_step(store, 0, COPY_READ, 1, since=0)
    n = len(replies)
    _push(store, 1, 1, [], [])
    assert not errors and len(replies) == n + 1 and _changed_answer(replies)[0].tolist() == [4]


def test_an_adagrad_tables_copy_has_the_accumulators_of_its_round():
    from pushpull.transport.protocol import COPY_READ

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store, optimizer="adagrad")
    _push(store, 0, 3, [2], [[2, 2]])
    _push(store, 1, 3, [], [])
    _copy_step(store, 0, COPY_READ, 2, since=0)
    ids, _, acc = _changed_answer(replies)
    assert not errors and ids.tolist() == [2, 5] and acc.reshape(2, 2)[0].tolist() == [0.25, 0.25]  # (1/2)^2


def test_a_copy_is_forgotten_once_every_rank_closed_it():
    from pushpull.transport.protocol import COPY_CLOSE

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    _copy_step(store, 0, COPY_CLOSE, 2)
    assert store.tables[7].snapshot is not None
    _copy_step(store, 1, COPY_CLOSE, 2)
    assert not errors and store.tables[7].snapshot is None


def test_a_read_of_a_closed_copy_is_refused():
    from pushpull.transport.protocol import COPY_CLOSE, COPY_READ

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    _copy_step(store, 0, COPY_CLOSE, 2)
    _copy_step(store, 0, COPY_READ, 2)
    assert errors and "rank 0 read or closed a copy of round 2 it has not open" in errors[-1]


def test_a_copy_of_another_round_while_one_is_open_is_refused_naming_the_ranks_reading_it():
    from pushpull.transport.protocol import COPY_CLOSE, COPY_OPEN

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    _copy_step(store, 0, COPY_CLOSE, 2)
    _push(store, 0, 3, [], [])
    _push(store, 1, 3, [], [])
    _copy_step(store, 0, COPY_OPEN, 3)
    assert errors and "while the copy of round 2 is open (rank(s) [1] have not closed it)" in errors[-1]


def test_a_copy_answers_each_row_once_per_rank():
    from pushpull.transport.protocol import COPY_READ

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    _copy_step(store, 0, COPY_READ, 2, since=-1)  # all 10 rows
    assert not errors
    _copy_step(store, 0, COPY_READ, 2, since=-1)
    assert errors and "rank 0 read 20 rows of the copy of round 2, more than this server's 10" in errors[-1]


def test_a_copy_of_a_table_outside_an_elastic_job_is_refused():
    from pushpull.transport.protocol import COPY_OPEN

    store, replies, errors = _store()
    _declare(store, elastic=False)
    _copy_step(store, 0, COPY_OPEN, 0)
    assert errors and "a commit's copy of a table declared outside an elastic job" in errors[-1]


def test_a_copy_keeps_a_rows_value_as_of_its_round_through_several_later_changes():
    from pushpull.transport.protocol import COPY_READ

    store, replies, errors = _store()
    _two_rounds_then_a_copy_of_round_2(store)
    for rnd in (3, 4):
        _push(store, 0, rnd, [5], [[10, 10]])
        _push(store, 1, rnd, [], [])
    _copy_step(store, 0, COPY_READ, 2, lo=5, hi=6, since=1)
    ids, rows = _changed_answer(replies)[:2]
    assert not errors and ids.tolist() == [5] and rows.tolist() == [-1.0, -1.0]


def test_a_copy_of_many_rows_grows_its_room_and_reads_every_row_as_of_its_round():
    from pushpull.transport.protocol import COPY_OPEN, COPY_READ

    store, replies, errors = _store()
    _declare(store, rows=5000, hi=5000)
    for rank in (0, 1):
        _copy_step(store, rank, COPY_OPEN, 0)
    for rnd, rows in ((1, range(0, 3000)), (2, range(2000, 5000))):  # 5000 rows kept, in 2 growths
        ids = np.arange(rows.start, rows.stop)
        _push(store, 0, rnd, ids, np.ones((len(ids), 2)))
        _push(store, 1, rnd, [], [])
    assert store.tables[7].snapshot.size == 5000
    _copy_step(store, 0, COPY_READ, 0, lo=0, hi=5000, since=-1)
    ids, rows = _changed_answer(replies)[:2]
    assert not errors and ids.tolist() == list(range(5000)) and not rows.any()  # the table at round 0: zeros


def test_a_read_after_its_ranks_close_is_refused_even_before_the_close_is_answered():
    from pushpull.transport.protocol import COPY_CLOSE, COPY_OPEN, COPY_READ

    store, replies, errors = _store()
    _declare(store)
    _push(store, 0, 1, [4], [[2, 2]])
    _copy_step(store, 0, COPY_OPEN, 1)  # round 1 is not applied yet: the close waits for it
    _copy_step(store, 0, COPY_CLOSE, 1)
    _copy_step(store, 0, COPY_READ, 1)
    assert errors and "rank 0 read or closed a copy of round 1 it has not open" in errors[-1]


def test_a_copy_of_a_round_far_ahead_of_the_table_is_refused():
    from pushpull.transport.protocol import COPY_OPEN

    store, replies, errors = _store()
    _declare(store)
    _copy_step(store, 0, COPY_OPEN, 50)
    assert errors and "opened a copy of round 50, the table is at round 0" in errors[-1]
