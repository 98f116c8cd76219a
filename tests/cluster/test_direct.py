"""The worker's direct path (pushpull.worker.direct) against a real ZeroMQ ROUTER standing in for a
server: what it returns, what it skips, and how each way of not getting an answer is reported."""
from __future__ import annotations

import threading

import pytest
import zmq

from pushpull.transport.protocol import Flags, Header, MsgType, decode, encode_json
from pushpull.worker.direct import DirectPath


@pytest.fixture
def server():
    """A ROUTER on loopback; ``answer(fn)`` replies to the next request with fn(header) -> [messages]."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    threads = []

    def answer(fn):
        def run():
            if not router.poll(5000):
                return
            ident, *frames = router.recv_multipart()
            for parts in fn(decode(frames).header):
                router.send_multipart([ident, *parts])
        t = threading.Thread(target=run, daemon=True)
        t.start()
        threads.append(t)

    path = DirectPath(ctx, 0, {"s0": f"tcp://127.0.0.1:{port}"})
    yield path, answer
    for t in threads:
        t.join(5)
    path.close()
    router.close(0)
    ctx.term()


def _push(key=7, rnd=3):
    return Header(MsgType.PUSH, sender=0, key=key, round=rnd, dtype=3, numel=1, nbytes=4,
                  flags=Flags.PULL | Flags.NO_ACK)


def _resp(key, rnd, body=b"\x00\x00\x80?"):
    return [Header(MsgType.PULL_RESP, key=key, round=rnd, nbytes=len(body)).pack(), body]


def test_returns_the_body_of_the_matching_answer(server):
    path, answer = server
    answer(lambda h: [_resp(h.key, h.round)])
    assert bytes(path.exchange("s0", _push(), b"\x00\x00\x80?", 5, lambda: None)) == b"\x00\x00\x80?"


def test_skips_late_answers_to_other_keys_and_rounds(server):
    path, answer = server
    answer(lambda h: [_resp(h.key + 1, h.round, b"bad!"), _resp(h.key, h.round - 2, b"old!"),
                      _resp(h.key, h.round, b"good")])
    assert bytes(path.exchange("s0", _push(), b"1234", 5, lambda: None)) == b"good"


def test_a_server_error_is_raised_with_its_text(server):
    path, answer = server
    answer(lambda h: [[Header(MsgType.ERROR, key=h.key).pack(), encode_json({"error": "tensor 'x': rank 1 bad"})]])
    with pytest.raises(RuntimeError, match="tensor 'x': rank 1 bad"):
        path.exchange("s0", _push(), b"1234", 5, lambda: None)


def test_no_answer_is_a_timeout(server):
    path, answer = server
    answer(lambda h: [])
    with pytest.raises(TimeoutError, match="within 1s"):
        path.exchange("s0", _push(), b"1234", 1, lambda: None)


def test_a_dead_cluster_ends_the_wait_at_once(server):
    path, answer = server
    answer(lambda h: [])
    with pytest.raises(ConnectionError, match="server 0 died"):
        path.exchange("s0", _push(), b"1234", 60, lambda: "server 0 died")


def test_closed_path_refuses_new_sockets(server):
    path, _ = server
    path.close()
    with pytest.raises(zmq.ZMQError):
        path.exchange("s0", _push(), b"1234", 1, lambda: None)
