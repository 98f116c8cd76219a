"""The wire format: headers and batches round-trip, malformed ones raise. A live server and Van against
malformed input and batching: tests/cluster/test_transport.py."""
import numpy as np
import pytest

from pushpull.transport.protocol import (
    HEADER_SIZE, Flags, Header, MsgType, ProtocolError, decode, dtype_code, dtype_name, is_answer, pack_batch,
    VERSION, unpack_batch,
)


def test_header_round_trip():
    h = Header(MsgType.PUSH, sender=3, key=(7 << 24) | 5, round=42, dtype=dtype_code("bfloat16"), numel=10,
               nbytes=20, req_id=9, flags=1, extra=2)
    buf = h.pack()
    assert len(buf) == HEADER_SIZE
    assert decode([buf, b"x" * 20]).header == h
    assert dtype_name(h.dtype) == "bfloat16"


@pytest.mark.parametrize("buf,match", [
    (b"short", "header is 5 bytes"),
    (b"\x00" * HEADER_SIZE, "bad magic"),
    (Header(MsgType.PUSH).pack()[:2] + bytes([VERSION + 1]) + Header(MsgType.PUSH).pack()[3:], "protocol version"),
    (Header(MsgType.PUSH).pack()[:3] + b"\xee" + Header(MsgType.PUSH).pack()[4:], "unknown message type"),
])
def test_malformed_headers_raise_protocol_error(buf, match):
    with pytest.raises(ProtocolError, match=match):
        decode([buf])


def _answer(**kw) -> bytes:
    return Header(MsgType.PULL_RESP, **{"key": 7, "round": 3, "gen": 2, **kw}).pack()


def test_is_answer_accepts_the_awaited_answer():
    assert is_answer(memoryview(_answer()), MsgType.PULL_RESP, 7, 3, 2)


@pytest.mark.parametrize("buf", [
    _answer(key=8), _answer(round=2), _answer(gen=1), _answer(flags=Flags.COMPRESSED),
    Header(MsgType.ERROR, key=7, round=3, gen=2).pack(), _answer()[:-1], b"\x00" * HEADER_SIZE,
    _answer()[:2] + bytes([VERSION + 1]) + _answer()[3:],
], ids=["other key", "other round", "older generation", "compressed", "error", "short", "bad magic", "version"])
def test_is_answer_refuses_anything_else(buf):
    """Whatever it refuses goes through decode(), which raises, skips or reports it as before."""
    assert not is_answer(buf, MsgType.PULL_RESP, 7, 3, 2)


def test_unknown_dtype_is_named():
    with pytest.raises(ProtocolError, match="complex64"):
        dtype_code("complex64")


def test_batch_round_trip_keeps_every_message_and_body():
    msgs = [[Header(MsgType.PUSH, key=1, round=3).pack(), np.arange(5, dtype=np.float32)],
            [Header(MsgType.PULL, key=2).pack()],                       # no body frame
            [Header(MsgType.ERROR, key=3).pack(), b""],                  # an empty body frame
            [Header(MsgType.INIT, key=4).pack(), b'{"name":"x"}']]
    frames = pack_batch(msgs)
    out = unpack_batch(decode(frames))
    assert [m.header.key for m in out] == [1, 2, 3, 4]
    assert out[0].header.round == 3 and np.frombuffer(out[0].body(), np.float32).tolist() == [0, 1, 2, 3, 4]
    assert out[1].frames == [] and bytes(out[2].body()) == b"" and bytes(out[3].body()) == b'{"name":"x"}'


@pytest.mark.parametrize("mangle,match", [
    (lambda f: [f[0], f[1][:-1]], "runs past the batch"),
    (lambda f: [f[0], f[1][:30]], "truncated"),
    (lambda f: [f[0], f[1] + b"x"], "stray bytes"),
    (lambda f: pack_batch([f]), "batch inside a batch"),
])
def test_malformed_batches_raise_protocol_error(mangle, match):
    frames = pack_batch([[Header(MsgType.PULL, key=2).pack()], [Header(MsgType.PUSH, key=1).pack(), b"abcd"]])
    with pytest.raises(ProtocolError, match=match):
        unpack_batch(decode(mangle(frames)))


SERVER = {"rank": 0, "host": "127.0.0.1", "port": 4242, "ipc": "ipc://@pushpull-server-1-ab"}


def test_a_worker_reaches_a_server_by_the_local_socket_it_offers():
    from pushpull.cluster.address import server_address

    assert server_address(SERVER, local_ipc=True) == "ipc://@pushpull-server-1-ab"


def test_a_worker_with_local_ipc_off_reaches_the_server_by_tcp():
    from pushpull.cluster.address import server_address

    assert server_address(SERVER, local_ipc=False) == "tcp://127.0.0.1:4242"


def test_a_server_that_offers_no_local_socket_is_reached_by_tcp():
    from pushpull.cluster.address import server_address

    assert server_address({**SERVER, "ipc": None, "host": "10.0.0.2"}, local_ipc=True) == "tcp://10.0.0.2:4242"
