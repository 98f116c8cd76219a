"""The direct lane (pushpull.transport.lane): framing, the handshake, and a live Van serving it beside its
ROUTER, with the worker's direct path (pushpull.worker.direct) on top. Real sockets throughout."""
from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from pushpull.transport.lane import (
    HELLO_MAX, MAGIC, LaneClient, LaneError, LaneServer, Reader, frame, lane_key,
)
from pushpull.transport.protocol import Flags, Header, MsgType, decode, encode_json
from pushpull.transport.security import JobAuth
from pushpull.worker.direct import DirectPath
from pushpull.transport.van import Van

AUTH = JobAuth("the test job's secret")
KEY = lane_key(AUTH)


def _wire(parts) -> bytes:
    return b"".join(bytes(b) for b in frame(parts))


def test_reader_reassembles_a_message_split_anywhere():
    m = _wire([b"abc", b"", b"defg"])
    for cut in range(len(m) + 1):
        r = Reader(1000)
        got = r.feed(m[:cut]) + r.feed(m[cut:] + m)
        assert [[bytes(f) for f in msg] for msg in got] == [[b"abc", b"", b"defg"]] * 2, cut


def test_frames_of_messages_read_together_survive_the_next_reads():
    r = Reader(1000)
    got = r.feed(_wire([b"first"]) + _wire([b"second"]) + _wire([b"thi"])[:5])
    later = r.feed(_wire([b"thi"])[5:]) + r.feed(_wire([b"x" * 20]))
    assert [[bytes(f) for f in msg] for msg in got] == [[b"first"], [b"second"]]
    assert [[bytes(f) for f in msg] for msg in later] == [[b"thi"], [b"x" * 20]]


def test_reader_refuses_a_message_over_its_limit():
    with pytest.raises(LaneError, match="a message of 1004 bytes"):
        Reader(1000).feed(_wire([b"x" * 1000]))


def test_reader_refuses_frames_that_run_past_their_message():
    bad = bytearray(_wire([b"abcd"]))
    bad[4] = 9  # the frame claims 9 bytes of a 8-byte message
    with pytest.raises(LaneError, match="runs past"):
        Reader(1000).feed(bytes(bad))


def test_lanes_are_encrypted_exactly_where_zeromq_is():
    assert not JobAuth("s3cret", "auto").lane_sealed("127.0.0.1")
    assert JobAuth("s3cret", "auto").lane_sealed("10.1.2.3")
    assert JobAuth("s3cret", "curve").lane_sealed("127.0.0.1")
    assert not JobAuth("s3cret", "plain").lane_sealed("10.1.2.3")


def test_the_lane_key_depends_on_the_secret():
    assert lane_key(JobAuth("a")) != lane_key(JobAuth("b")) and lane_key(None) == b""


@pytest.fixture(params=["unix", "tcp"])
def server(request):
    """A Van with a ROUTER and its lane on loopback; handled messages land in ``got``, and each PUSH is
    answered with a PULL_RESP carrying the same body, to whichever identity pushed."""
    got: list = []
    van = Van("lane-test")

    def handle(identity, msg):
        got.append((identity, msg.header, bytes(msg.body_view()) if msg.frames else b""))
        if msg.header.type == MsgType.PUSH:
            h = msg.header
            van.send("r", Header(MsgType.PULL_RESP, key=h.key, round=h.round), [bytes(msg.body_view())],
                     identity=identity)
        elif msg.header.type == MsgType.PULL:
            van.send("r", Header(MsgType.ERROR, key=msg.header.key), [encode_json({"error": "tensor 'x': no"})],
                     identity=identity)

    van.bind_router("r", "127.0.0.1", 0, handle)
    address = van.bind_lane("r", "127.0.0.1", KEY, max_message_bytes=4096, local=request.param == "unix")
    van.start()
    yield van, address, got
    van.stop()


def _push(key=7, rnd=3):
    return Header(MsgType.PUSH, sender=0, key=key, round=rnd, dtype=3, numel=1, nbytes=4,
                  flags=Flags.PULL | Flags.NO_ACK)


def test_a_proven_lane_reaches_the_handler_and_gets_the_answer(server):
    van, address, got = server
    assert address.startswith("unix:@" if "unix" in address else "tcp://127.0.0.1:")
    c = LaneClient(address, b"w0.l0", KEY, 5)
    c.settimeout(5)
    c.send([_push().pack(), b"\x00\x00\x80?"])
    answer = decode(c.recv())
    assert (answer.header.type, answer.header.key, answer.header.round) == (MsgType.PULL_RESP, 7, 3)
    assert bytes(answer.body_view()) == b"\x00\x00\x80?"
    assert got[0][0] == b"w0.l0" and got[0][2] == b"\x00\x00\x80?"
    c.close()


def test_a_lane_without_the_job_secret_is_refused_before_any_message(server, caplog):
    van, address, got = server
    with caplog.at_level(logging.WARNING), pytest.raises(LaneError, match="closed the connection"):
        LaneClient(address, b"w0.l0", b"another job", 5)
    time.sleep(0.2)
    assert got == []
    assert "wrong credentials" in caplog.text


def test_a_second_lane_with_an_identity_in_use_is_refused(server):
    van, address, got = server
    first = LaneClient(address, b"w0.l0", KEY, 5)
    with pytest.raises(LaneError):
        LaneClient(address, b"w0.l0", KEY, 5)
    first.close()


def test_a_message_over_the_servers_limit_closes_the_lane(server):
    van, address, got = server
    c = LaneClient(address, b"w0.l0", KEY, 5)
    c.settimeout(5)
    c.send([_push().pack(), b"x" * 5000])
    with pytest.raises(LaneError, match="closed the connection"):
        c.recv()
    assert got == []
    c.close()


def test_an_unproven_peer_that_talks_too_much_is_disconnected(server):
    van, address, got = server
    if address.startswith("unix:@"):
        s = socket.socket(socket.AF_UNIX)
        s.connect("\0" + address[len("unix:@"):])
    else:
        host, port = address[len("tcp://"):].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    s.settimeout(5)
    assert MAGIC in s.recv(1024)  # the greeting
    s.sendall(_wire([b"y" * (HELLO_MAX + 1)]))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and s.recv(1024):
        pass
    assert got == []
    s.close()


def test_the_direct_path_uses_the_lane_and_raises_the_servers_error(server):
    van, address, got = server
    path = DirectPath(None, 0, {}, auth=AUTH, lanes={"s0": address})  # no zmq context: the lane must serve
    try:
        assert bytes(path.exchange("s0", _push(), b"abcd", 5, lambda: None)) == b"abcd"
        with pytest.raises(RuntimeError, match="tensor 'x': no"):
            path.exchange("s0", Header(MsgType.PULL, sender=0, key=7, round=3), None, 5, lambda: None)
    finally:
        path.close()
    assert got[0][0].startswith(b"w0.l")  # the lane's identity: the worker's rank, a channel of its own


def test_the_direct_path_falls_back_to_zeromq_when_the_lane_cannot_open(caplog):
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def answer():
        if router.poll(5000):
            ident, *frames = router.recv_multipart()
            h = decode(frames).header
            router.send_multipart([ident, Header(MsgType.PULL_RESP, key=h.key, round=h.round).pack(), b"zmq!"])
    t = threading.Thread(target=answer, daemon=True)
    t.start()
    path = DirectPath(ctx, 0, {"s0": f"tcp://127.0.0.1:{port}"}, lanes={"s0": "unix:@pushpull-test-no-such-lane"})
    try:
        with caplog.at_level(logging.WARNING):
            assert bytes(path.exchange("s0", _push(), b"abcd", 5, lambda: None)) == b"zmq!"
        assert "direct lane to server 0" in caplog.text and "go over ZeroMQ" in caplog.text
    finally:
        t.join(5)
        path.close()
        router.close(0)
        ctx.term()


def _drop_every_lane(van) -> None:
    lane = van._lanes["r"]
    closed = threading.Event()
    van.call_soon(lambda: ([lane.drop(c, None) for c in list(lane.conns.values())], closed.set()))
    assert closed.wait(5)


def test_a_broken_lane_fails_the_call_naming_the_server_and_the_next_call_reopens_it(server, monkeypatch):
    import pushpull.worker.direct as direct

    monkeypatch.setattr(direct, "LANE_GRACE_S", 0.1)
    van, address, got = server
    path = DirectPath(None, 0, {}, auth=AUTH, lanes={"s0": address})
    try:
        assert bytes(path.exchange("s0", _push(rnd=1), b"abcd", 5, lambda: None)) == b"abcd"
        _drop_every_lane(van)
        with pytest.raises(ConnectionError, match="direct lane to server 0 broke"):
            path.exchange("s0", _push(rnd=2), b"abcd", 5, lambda: None)
        assert bytes(path.exchange("s0", _push(rnd=3), b"efgh", 5, lambda: None)) == b"efgh"
    finally:
        path.close()


def test_a_lane_closed_because_the_job_failed_reports_the_jobs_reason(server):
    """A server closes its lanes as it stops for a dead worker; the membership's reason, which arrives a
    moment later, is what the call raises."""
    van, address, got = server
    path = DirectPath(None, 0, {}, auth=AUTH, lanes={"s0": address})
    t_closed = []
    try:
        assert bytes(path.exchange("s0", _push(rnd=1), b"abcd", 5, lambda: None)) == b"abcd"
        _drop_every_lane(van)
        t_closed.append(time.monotonic())
        alive = lambda: "worker rank 1 failed" if time.monotonic() - t_closed[0] > 0.3 else None  # noqa: E731
        with pytest.raises(ConnectionError, match="^worker rank 1 failed$"):
            path.exchange("s0", _push(rnd=2), b"abcd", 5, alive)
    finally:
        path.close()


def test_opening_a_lane_to_a_silent_server_stops_at_the_jobs_failure():
    """A frozen server accepts (the kernel does) but never greets: the call ends with the membership's
    reason, not after the lane's 10 s connect timeout and a fallback."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    path = DirectPath(None, 0, {}, auth=AUTH, lanes={"s0": f"tcp://127.0.0.1:{silent.getsockname()[1]}"})
    t0 = time.monotonic()
    try:
        with pytest.raises(ConnectionError, match="^server 0 failed: no heartbeat$"):
            path.exchange("s0", _push(), b"abcd", 30,
                          lambda: "server 0 failed: no heartbeat" if time.monotonic() - t0 > 0.3 else None)
        assert time.monotonic() - t0 < 3
    finally:
        path.close()
        silent.close()


def test_a_lane_listening_on_every_interface_advertises_the_servers_address():
    """PUSHPULL_BIND_HOST=* : the lane listens everywhere but the workers are told the advertised address
    (a wildcard address would send a worker on another machine to its own loopback)."""
    lane = LaneServer("*", b"k" * 32, 0, lambda fd, ev: None, lambda ident, frames: None, None,
                      advertised="127.0.0.1")
    try:
        assert lane.address.startswith("tcp://127.0.0.1:"), lane.address
        assert lane.listener.getsockname()[0] == "0.0.0.0"
    finally:
        lane.listener.close()
