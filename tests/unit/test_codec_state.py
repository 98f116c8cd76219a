"""The compression state an elastic commit keeps (pushpull.worker.codec_state), without processes: a codec chain
loaded back from its state_dict compresses the replayed steps exactly as the first time (error feedback, Nesterov
momentum, a random stream's position); the wire form of a state is bounded by the key it is for; a server's codec
drops its residual at a change and takes the newest commit's state back. The whole path under the launcher:
tests/cluster/test_elastic.py::test_compressed_training_ends_where_a_run_without_failures_would."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pushpull.compression import build, decode_payload
from pushpull.compression.state import pack_state, unpack_state
from pushpull.server.codec import ServerCodec
from pushpull.worker.codec_state import holds

SPECS = {
    "topk+ef+momentum": {"compressor": "topk", "k": 0.2, "ef": "vanilla", "momentum": "nesterov", "mu": 0.9},
    "onebit+ef": {"compressor": "onebit", "ef": "vanilla"},
    "randomk": {"compressor": "randomk", "k": 0.1, "seed": 5},
    "dithering+ef": {"compressor": "dithering", "k": 4, "seed": 2, "ef": "vanilla"},
}


def _grads(count: int, n: int = 200, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(count)]


def _clone(state: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_a_chain_loaded_back_replays_the_steps_after_it_exactly(spec):
    chain = build(spec, lr_getter=lambda: 0.1)
    grads = _grads(8)
    for g in grads[:3]:
        chain.compress(g)
    kept = _clone(chain.state_dict())
    first = [decode_payload(chain.compress(g)) for g in grads[3:]]
    chain.load_state_dict(kept)
    again = [decode_payload(chain.compress(g)) for g in grads[3:]]
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_without_the_load_a_replayed_step_differs():
    """What the test above guards against: the momentum and residual of the steps after the commit count twice."""
    chain = build(SPECS["topk+ef+momentum"])
    grads = _grads(5)
    for g in grads[:2]:
        chain.compress(g)
    first = [decode_payload(chain.compress(g)) for g in grads[2:]]
    again = [decode_payload(chain.compress(g)) for g in grads[2:]]
    assert not all(torch.equal(a, b) for a, b in zip(first, again))


def test_a_loaded_state_is_a_copy_the_codec_does_not_write_into():
    chain = build(SPECS["onebit+ef"])
    chain.compress(_grads(1)[0])
    kept = _clone(chain.state_dict())
    before = kept["error"].clone()
    chain.load_state_dict(kept)
    chain.compress(_grads(1, seed=1)[0])
    assert torch.equal(kept["error"], before)


def test_loading_a_state_with_a_name_the_chain_lacks_is_refused():
    chain = build(SPECS["onebit+ef"])
    with pytest.raises(ValueError, match="momentum"):
        chain.load_state_dict({"momentum": torch.zeros(3)})
    with pytest.raises(ValueError, match="rng"):
        chain.load_state_dict({"inner.rng": {}})


def test_a_state_survives_the_wire_form():
    chain = build(SPECS["dithering+ef"], lr_getter=lambda: 0.5)
    chain.compress(_grads(1)[0])
    state = chain.state_dict()
    back = unpack_state(pack_state(state), 200, "float32")
    assert set(back) == set(state)
    assert torch.equal(back["error"], state["error"]) and back["lr_prev"] == 0.5
    assert back["inner.rng"] == state["inner.rng"]


@pytest.mark.parametrize("numel,dtype", [(199, "float32"), (200, "float16")])
def test_the_wire_form_is_refused_for_another_keys_size_or_dtype(numel, dtype):
    chain = build(SPECS["onebit+ef"])
    chain.compress(_grads(1)[0])
    with pytest.raises(ValueError, match="the key is"):
        unpack_state(pack_state(chain.state_dict()), numel, dtype)


@pytest.mark.parametrize("cut", ["short", "json", "tensor", "trailing"])
def test_a_malformed_wire_form_is_refused(cut):
    chain = build(SPECS["onebit+ef"])
    chain.compress(_grads(1)[0])
    buf = pack_state(chain.state_dict())
    bad = {"short": buf[:2], "json": buf[:4] + b"[" + buf[5:], "tensor": buf[:-4], "trailing": buf + b"x"}[cut]
    with pytest.raises(ValueError, match="codec state"):
        unpack_state(bad, 200, "float32")


def _server(spec=None) -> ServerCodec:
    return ServerCodec(spec or SPECS["onebit+ef"], "float32", 200, key=3)


def _sum(codec: ServerCodec, total: torch.Tensor) -> np.ndarray:
    return codec.compress_sum(total.numpy().copy())


def test_a_server_codec_goes_back_to_its_own_copy_of_the_commit():
    """A lost worker (the holder of the other copy, maybe): the server's own copy is enough."""
    codec, grads = _server(), _grads(4)
    _sum(codec, grads[0])
    codec.state(7)
    want = [_sum(codec, g) for g in grads[1:]]
    assert codec.rollback(7, gen=1)
    assert all(np.array_equal(_sum(codec, g), w) for g, w in zip(grads[1:], want))


def test_a_server_codec_without_a_copy_of_that_commit_starts_from_zero():
    codec, fresh, grads = _server(), _server(), _grads(3)
    _sum(codec, grads[0])
    codec.state(7)
    _sum(codec, grads[1])
    assert not codec.rollback(6, gen=1)
    assert np.array_equal(_sum(codec, grads[2]), _sum(fresh, grads[2]))


def test_a_server_keeps_the_last_two_commits_copies():
    """A commit with sparse tables counts once their copies are in: a change before that goes back to the one
    before, whose copy the server must still have."""
    codec, grads = _server(), _grads(4)
    for c, g in enumerate(grads[:3], start=1):
        _sum(codec, g)
        codec.state(c)
    assert sorted(codec.kept) == [2, 3]
    assert codec.rollback(2, gen=1) and not codec.rollback(1, gen=2)


def test_a_server_codec_takes_a_workers_copy_back_after_a_change():
    codec, grads = _server(), _grads(4)
    _sum(codec, grads[0])
    kept = codec.state(1)
    want = [_sum(codec, g) for g in grads[1:]]
    moved = _server()  # the key moved to another server, which never had it
    assert not moved.rollback(1, gen=1) and moved.load(kept, 1, gen=1)
    assert all(np.array_equal(_sum(moved, g), w) for g, w in zip(grads[1:], want))


def test_an_older_commits_state_does_not_replace_a_newer_one_in_a_generation():
    codec, grads = _server(), _grads(3)
    _sum(codec, grads[0])
    old = codec.state(4)
    _sum(codec, grads[1])
    new = codec.state(5)
    assert codec.load(new, 5, gen=1)
    assert not codec.load(old, 4, gen=1)
    assert codec.rollback(5, gen=1)  # already in: kept as it is
    assert codec.state(6) == new
    assert codec.load(old, 4, gen=2) and codec.state(7) == old  # a new generation takes any commit's


def test_a_server_codec_refuses_a_state_of_another_size():
    codec = ServerCodec(SPECS["onebit+ef"], "float32", 100, key=3)
    with pytest.raises(ValueError, match="the key is float32"):
        codec.load(pack_state({"error": torch.zeros(200), "lr_prev": None}), 1, gen=1)


@pytest.mark.parametrize("state", [{"error": torch.zeros(200), "lr_prev": "x"}, {"error": [1, 2], "lr_prev": None},
                                   {"error": None, "lr_prev": {"a": 1}}, {"momentum": torch.zeros(200)}],
                         ids=["lr-text", "error-list", "lr-dict", "unknown-name"])
def test_a_malformed_state_is_refused_and_leaves_the_codec_as_it_was(state):
    codec, twin, grads = _server(), _server(), _grads(3)
    for g in grads[:2]:
        _sum(codec, g)
        _sum(twin, g)
    with pytest.raises(ValueError, match="codec state"):
        codec.load(pack_state(state), 9, gen=1)
    assert np.array_equal(_sum(codec, grads[2]), _sum(twin, grads[2]))


@pytest.mark.parametrize("meta", [b'{"values": {}, "tensors": [["error", "float32", 200.0]]}',
                                  b'{"values": ' + b"[" * 5000 + b"]" * 5000 + b', "tensors": []}'],
                         ids=["float-count", "deep-json"])
def test_a_state_with_a_bad_count_or_deep_json_is_refused(meta):
    with pytest.raises(ValueError, match="codec state"):
        unpack_state(len(meta).to_bytes(4, "little") + meta + bytes(800), 200, "float32")


def test_server_state_of_random_k_is_empty_and_loads():
    codec = _server(SPECS["randomk"])
    assert codec.load(codec.state(1), 1, gen=1)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_every_partition_is_held_by_one_rank(size):
    keys = [(t << 24) | i for t in range(1, 9) for i in range(3)]
    for key in keys:
        assert sum(holds(key, r, size) for r in range(size)) == 1
    assert all(any(holds(k, r, size) for k in keys) for r in range(size))  # spread over the ranks


def _server_stub():
    """A server's CODEC_STATE handling without its sockets (what it would send is captured)."""
    from types import SimpleNamespace

    from pushpull.server.server import Server

    srv = Server.__new__(Server)
    srv.keys, srv.engines = {}, []
    srv.declarations = SimpleNamespace(moved_here=set(), codec_states={})
    sent = []
    srv._reply = lambda ident, header, frames=(): sent.append(("reply", header, list(frames)))
    srv._error = lambda ident, key, text, req_id=0: sent.append(("error", key, text))
    return srv, sent


def _msg(key: int, step: int, body: bytes = b"", rnd: int = 0, commit: int = 1, gen: int = 1):
    from pushpull.transport.protocol import Header, Msg, MsgType

    return Msg(Header(MsgType.CODEC_STATE, sender=0, key=key, round=rnd, numel=step, extra=commit, gen=gen), [body])


def test_a_load_for_a_key_moved_here_and_not_declared_yet_waits_for_its_declaration_newest_commit_first():
    from pushpull.transport.protocol import STATE_WRITE

    srv, sent = _server_stub()
    srv.declarations.moved_here.add(9)
    srv._codec_state(b"w0", _msg(9, STATE_WRITE, b"new", commit=5))
    srv._codec_state(b"w1", _msg(9, STATE_WRITE, b"old", commit=4))
    assert srv.declarations.codec_states[9] == (b"new", 5, 1)
    assert [kind for kind, *_ in sent] == ["reply", "reply"]


def test_a_load_for_a_key_the_server_knows_nothing_of_is_answered_and_dropped():
    """Nothing to roll back, nothing to keep: the worker goes on rather than failing its job."""
    from pushpull.transport.protocol import STATE_WRITE

    srv, sent = _server_stub()
    srv._codec_state(b"w0", _msg(9, STATE_WRITE, b""))
    srv._codec_state(b"w0", _msg(9, STATE_WRITE, b"copy"))
    assert [kind for kind, *_ in sent] == ["reply", "reply"] and srv.declarations.codec_states == {}


def test_a_read_of_a_key_the_server_does_not_hold_is_an_error():
    from pushpull.transport.protocol import STATE_READ

    srv, sent = _server_stub()
    srv._codec_state(b"w0", _msg(9, STATE_READ))
    assert sent[0][0] == "error" and "does not hold" in sent[0][2]


def test_a_read_of_another_round_than_the_last_completed_is_refused_naming_both():
    from types import SimpleNamespace

    from pushpull.server.keystate import RoundError
    from pushpull.transport.protocol import STATE_READ

    srv, _ = _server_stub()
    ks = SimpleNamespace(name="g", completed=4, codec=_server())
    with pytest.raises(RoundError, match="round 3.*completed round 4"):
        srv._codec_state_op(b"w0", _msg(9, STATE_READ, rnd=3), ks)


def test_a_rollback_without_a_copy_keeps_a_workers_copy_loaded_first_in_the_generation():
    """Ranks that disagree on the last commit (a change during one): the order the loads arrive in must not decide."""
    codec, grads = _server(), _grads(3)
    _sum(codec, grads[0])
    old = codec.state(4)
    _sum(codec, grads[1])
    assert codec.load(old, 4, gen=1)
    assert not codec.rollback(5, gen=1)  # no copy of commit 5 here: nothing better to go back to
    assert codec.state(6) == old
