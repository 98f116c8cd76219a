"""A lost server's outer keys, started again from the workers' seeds (issue 30, item 3), without processes:
the momentum a worker infers from the global parameters alone matches the servers' (pushpull.outer.
momentum_after), a key reseeded from it steps on exactly as the one that was lost, the new server takes the
newest seed its workers give and refuses a malformed one naming the rank, and a bfloat16 outer key steps in
float32 and answers bfloat16 bits. The whole path under the launcher: tests/cluster/test_diloco.py."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pushpull.outer import OuterSGD, momentum_after
from pushpull.server.declare import Declarations
from pushpull.server.keystate import KeyState
from pushpull.server.reduce import bf16_to_f32, f32_to_bf16
from pushpull.transport.protocol import Header, Msg, MsgType, dtype_code, encode_json

SETTINGS = [(0.7, 0.9, True), (0.5, 0.8, False), (1.0, 0.0, False)]


def _rounds(outer: OuterSGD, rng, count: int = 6, n: int = 50):
    """The global parameters after the start and ``count`` rounds, with the momentum after each."""
    params = [outer.apply(rng.standard_normal(n).astype(np.float32), 1).copy()]
    bufs = [None]
    for _ in range(count):
        params.append(outer.apply(rng.standard_normal((3, n)).astype(np.float32).sum(0) * 0.01, 3).copy())
        bufs.append(None if outer.buf is None else outer.buf.copy())
    return params, bufs


@pytest.mark.parametrize("lr,mu,nesterov", SETTINGS)
def test_the_momentum_inferred_from_the_parameters_is_the_servers(lr, mu, nesterov):
    params, bufs = _rounds(OuterSGD(lr, mu, nesterov), np.random.default_rng(1))
    buf = None
    for before, after, want in zip(params, params[1:], bufs[1:]):
        buf = momentum_after((before - after) / np.float32(lr), buf, mu, nesterov)
        if want is None:
            assert buf is None
        else:
            np.testing.assert_allclose(buf, want, rtol=1e-3, atol=1e-5)


def _outer_key(lr=0.7, mu=0.9, nesterov=True, dtype="float32", numel=50) -> KeyState:
    ks = KeyState(9, "diloco.w", dtype, numel, 2)
    ks.op, ks.outer = "outer", OuterSGD(lr, mu, nesterov)
    return ks


@pytest.mark.parametrize("lr,mu,nesterov", SETTINGS)
def test_a_reseeded_key_steps_on_as_the_lost_one_would_have(lr, mu, nesterov):
    rng = np.random.default_rng(2)
    lost = OuterSGD(lr, mu, nesterov)
    params, bufs = _rounds(lost, rng, count=3)
    buf = None
    for before, after in zip(params, params[1:]):
        buf = momentum_after((before - after) / np.float32(lr), buf, mu, nesterov)
    ks = _outer_key(lr, mu, nesterov)
    ks.reseed(4, params[-1].copy(), None if buf is None else buf.astype(np.float32))
    retried = ks.outer_push(4, 0, np.zeros(50, np.float32), (b"w", 0, 4, 1))  # a worker that missed round 4
    assert retried.ready and np.array_equal(retried.out, params[-1])
    pushes = rng.standard_normal((2, 50)).astype(np.float32) * 0.01
    ks.outer_push(5, 0, pushes[0], (b"w", 0, 5, 1))
    got = ks.outer_push(5, 1, pushes[1], (b"w", 1, 5, 1)).out
    np.testing.assert_allclose(got, lost.apply(pushes.sum(0), 2), rtol=1e-5, atol=1e-6)


class _Replies:
    def __init__(self):
        self.acks, self.errors = [], []

    def reply(self, identity, header, body=()):
        self.acks.append((identity, header.key))

    def error(self, identity, key, text, req_id=0):
        self.errors.append((identity, text))


def _declarations(workers: int = 2):
    keys: dict = {}
    replies = _Replies()
    members = SimpleNamespace(num_workers=workers, joined=set())
    cfg = SimpleNamespace(server_max_keys=100, max_message_bytes=1 << 20)
    decls = Declarations(cfg, members, keys, None, replies.reply, replies.error)
    decls.moved_here = {7}  # the key the tests declare moved here from a lost server
    return decls, keys, replies


OUTER_META = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}


def _init(decls, rank: int, seed=None, frames=(), numel: int = 4, op: str = "outer", dtype: str = "float32"):
    req = {"name": "diloco.w", "op": op, "kind": "diloco" if op == "outer" else "async",
           "meta": OUTER_META if op == "outer" else None}
    if seed is not None:
        req["seed"] = seed
    h = Header(MsgType.INIT, sender=rank, key=7, dtype=dtype_code(dtype), numel=numel, req_id=rank + 1)
    decls.init(f"w{rank}".encode(), Msg(h, [encode_json(req), *frames]))


def test_the_new_server_starts_a_moved_key_from_the_newest_seed():
    decls, keys, replies = _declarations()
    old, new = np.full(4, 1.0, np.float32), np.full(4, 2.0, np.float32)
    _init(decls, 0, {"round": 5, "momentum": True}, [new.tobytes(), np.full(4, 0.5, np.float32).tobytes()])
    _init(decls, 1, {"round": 4, "momentum": True}, [old.tobytes(), np.zeros(4, np.float32).tobytes()])
    ks = keys[7]
    assert ks.outer_done[0] == 5 and np.array_equal(ks.outer.params, new) and np.array_equal(ks.outer.buf, [0.5] * 4)
    assert not replies.errors and len(replies.acks) == 2


def test_a_moved_store_key_starts_from_the_newest_pull():
    decls, keys, replies = _declarations()
    _init(decls, 0, {"round": 3, "momentum": False}, [np.full(4, 7.0, np.float32).tobytes()], op="store")
    _init(decls, 1, {"round": 9, "momentum": False}, [np.full(4, 5.0, np.float32).tobytes()], op="store")
    assert list(keys[7].store) == [5.0] * 4 and not replies.errors


def test_a_store_seed_with_momentum_is_refused():
    decls, keys, replies = _declarations()
    _init(decls, 0, {"round": 3, "momentum": True}, [np.zeros(4, np.float32).tobytes()] * 2, op="store")
    assert keys == {} and "only an outer key has momentum" in replies.errors[0][1]


def test_a_seed_for_a_key_that_did_not_move_here_is_refused():
    decls, keys, replies = _declarations()
    decls.moved_here = set()
    _init(decls, 0, {"round": 3, "momentum": False}, [np.zeros(4, np.float32).tobytes()])
    assert keys == {} and "key 7 did not move to this server" in replies.errors[0][1]


def test_a_key_declared_without_seeds_starts_empty():
    decls, keys, _ = _declarations()
    _init(decls, 0), _init(decls, 1)
    assert keys[7].outer_done is None and keys[7].outer.params is None


@pytest.mark.parametrize("seed,frames,op,needle", [
    ({"round": 3, "momentum": False}, [np.zeros(3, np.float32).tobytes()], "outer", "12 bytes, 4 x 4 expected"),
    ({"round": 3, "momentum": True}, [np.zeros(4, np.float32).tobytes()], "outer", "1 frame"),
    ({"round": 0, "momentum": False}, [np.zeros(4, np.float32).tobytes()], "outer", "integer >= 1"),
    ({"round": 3, "momentum": False}, [np.zeros(4, np.float32).tobytes()], "sum", "only an outer or store key"),
])
def test_a_malformed_seed_is_refused_naming_the_rank(seed, frames, op, needle):
    decls, keys, replies = _declarations()
    _init(decls, 1, seed, frames, op=op)
    assert keys == {} and len(replies.errors) == 1
    assert "rank 1's seed" in replies.errors[0][1] and needle in replies.errors[0][1], replies.errors


def test_a_bfloat16_outer_key_steps_in_float32_and_answers_bfloat16_bits():
    ks = _outer_key(lr=1.0, mu=0.0, nesterov=False, dtype="bfloat16", numel=3)
    start = f32_to_bf16(np.array([1.5, -2.0, 0.25], np.float32))
    ks.outer_push(1, 0, start, (b"w", 0, 1, 1))
    got = ks.outer_push(1, 1, start, (b"w", 1, 1, 1)).out
    np.testing.assert_array_equal(bf16_to_f32(got), [1.5, -2.0, 0.25])
    delta = f32_to_bf16(np.array([0.5, 0.5, 0.5], np.float32))
    ks.outer_push(2, 0, delta, (b"w", 0, 2, 1))
    got = ks.outer_push(2, 1, delta, (b"w", 1, 2, 1)).out
    np.testing.assert_array_equal(bf16_to_f32(got), [1.0, -2.5, -0.25])


@pytest.mark.parametrize("lr,mu,nesterov", SETTINGS)
def test_the_worker_advances_an_outer_keys_seed_as_each_answer_arrives(lr, mu, nesterov):
    """TensorTable.advance_seed, called on the I/O thread with each round's answer: the seed is the answer
    and the servers' momentum, with no lag behind an answer the worker holds."""
    from pushpull import dtypes
    from pushpull.worker.table import Entry, KeySpec, TensorTable

    meta = tuple(sorted({"outer_lr": lr, "outer_momentum": mu, "nesterov": nesterov}.items()))
    e = Entry("diloco.w", (50,), dtypes.get("float32"), None, [], spec=KeySpec(kind="diloco", op="outer", meta=meta))
    table = TensorTable()
    outer = OuterSGD(lr, mu, nesterov)
    params, bufs = _rounds(outer, np.random.default_rng(3))
    for rid, (p, want) in enumerate(zip(params, bufs), 1):
        answer = p.copy()
        table.advance_seed(e, rid, answer.view(np.uint8))
        answer[:] = 0  # the caller's output: the seed must not share it
        got_rid, got, buf = table.seeds["diloco.w"]
        assert got_rid == rid and np.array_equal(got, p)
        if want is None:
            assert buf is None
        else:
            np.testing.assert_allclose(buf, want, rtol=1e-3, atol=1e-5)


def test_a_seed_is_taken_only_until_the_moved_key_is_declared_here():
    """A moved key waits for its seeds across changes (a worker declares it at its next use), but once declared
    here it is this server's own: a later seed for it is refused."""
    decls, keys, replies = _declarations()
    seed = [np.full(4, 2.0, np.float32).tobytes()]
    _init(decls, 0, {"round": 5, "momentum": False}, seed, op="store")
    _init(decls, 1, {"round": 5, "momentum": False}, seed, op="store")
    assert 7 in keys and 7 not in decls.moved_here and not replies.errors
    del keys[7]  # as if it moved away and back without the scheduler saying so
    _init(decls, 0, {"round": 6, "momentum": False}, seed, op="store")
    assert "key 7 did not move to this server" in replies.errors[0][1]
