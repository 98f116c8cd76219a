"""Sealed lanes (pushpull.transport.seal over pushpull.transport.lane) and a worker's data lane through a Van:
the handshake, what a stranger, a tamperer or a replayer gets, large messages read into their own buffers.
Real sockets throughout."""
from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

from pushpull.transport import seal
from pushpull.transport.lane import BIG_MESSAGE, MAGIC, LaneClient, LaneError, Reader, frame, lane_key
from pushpull.transport.protocol import Flags, Header, MsgType
from pushpull.transport.security import JobAuth
from pushpull.transport.van import Van

AUTH = JobAuth("the sealed test job's secret")
KEY = lane_key(AUTH)


def _push(key=7, rnd=3, nbytes=4):
    return Header(MsgType.PUSH, sender=0, key=key, round=rnd, dtype=3, numel=nbytes // 4, nbytes=nbytes,
                  flags=Flags.PULL | Flags.NO_ACK)


@pytest.fixture(params=[True, False], ids=["sealed", "plain"])
def server(request):
    """A Van with a ROUTER and a TCP lane on loopback that echoes each PUSH's body back in a PULL_RESP."""
    got: list = []
    van = Van("sealed-test")

    def handle(identity, msg):
        body = msg.body_view() if msg.frames else b""
        got.append((identity, msg.header, bytes(body[:16])))
        if msg.header.type == MsgType.PUSH:
            h = msg.header
            van.send("r", Header(MsgType.PULL_RESP, key=h.key, round=h.round), [body], identity=identity)

    van.bind_router("r", "127.0.0.1", 0, handle)
    address = van.bind_lane("r", "127.0.0.1", KEY, max_message_bytes=64 << 20, sealed=request.param)
    van.start()
    yield van, address, got, request.param
    van.stop()


def _raw(address):
    host, port = address[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.settimeout(5)
    return s


def test_a_sealed_lane_echoes_a_large_message_exactly(server):
    van, address, got, sealed = server
    c = LaneClient(address, b"w0.l0", KEY, 5, sealed=sealed)
    c.settimeout(5)
    data = np.random.default_rng(0).integers(0, 255, 9 << 20, dtype=np.uint8)
    c.send([_push(nbytes=data.nbytes).pack(), data])
    frames = None
    deadline = time.monotonic() + 10
    while frames is None and time.monotonic() < deadline:
        frames = c.recv()
    assert frames is not None and np.array_equal(np.frombuffer(frames[1], np.uint8), data)
    c.close()


def test_a_sealed_lane_refuses_a_client_that_does_not_encrypt(server):
    van, address, got, sealed = server
    with pytest.raises(LaneError, match="unencrypted lane where this job encrypts" if not sealed
                       else "encrypted lane where this job does not encrypt"):
        LaneClient(address, b"w0.l0", KEY, 5, sealed=not sealed)
    assert got == []


def test_a_sealed_lane_without_the_job_secret_is_refused_before_any_message(server):
    van, address, got, sealed = server
    with pytest.raises(LaneError):
        LaneClient(address, b"w0.l0", lane_key(JobAuth("another job")), 5, sealed=sealed)
    assert got == []


def test_bytes_on_the_wire_are_not_the_payload_when_sealed():
    a, b = seal.Ephemeral(), seal.Ephemeral()
    sa = seal.Session(a.shared(b.public), KEY, b"s" * 32, b"c" * 32, b"w0", client=True)
    bufs, n = sa.seal([b"header", b"gradient bytes " * 100])
    wire = b"".join(bytes(x) for x in bufs)
    assert len(wire) == n and b"gradient bytes" not in wire and b"header" not in wire


def _pair():
    a, b = seal.Ephemeral(), seal.Ephemeral()
    shared = a.shared(b.public)
    client = seal.Session(shared, KEY, b"s" * 32, b"c" * 32, b"w0", client=True)
    server = seal.Session(b.shared(a.public), KEY, b"s" * 32, b"c" * 32, b"w0", client=False)
    return client, server


def _wire(bufs):
    return bytearray(b"".join(bytes(x) for x in bufs))


def test_a_sealed_message_opens_on_the_other_end():
    client, server = _pair()
    r = Reader(1 << 20, session=server)
    msgs = r.feed(_wire(client.seal([b"head", b"body" * 50])[0]))
    assert [[bytes(f) for f in m] for m in msgs] == [[b"head", b"body" * 50]]


def test_a_flipped_bit_fails_the_message():
    client, server = _pair()
    wire = _wire(client.seal([b"head", b"body" * 50])[0])
    wire[-20] ^= 1
    with pytest.raises(seal.SealError):
        Reader(1 << 20, session=server).feed(wire)


def test_a_replayed_message_fails():
    client, server = _pair()
    wire = _wire(client.seal([b"head", b"body"])[0])
    r = Reader(1 << 20, session=server)
    r.feed(bytearray(wire))
    with pytest.raises(seal.SealError):
        r.feed(bytearray(wire))


def test_frames_moved_between_messages_fail():
    """Re-splitting two sealed messages (the lengths are not secret) must not pass: the associated data binds
    each record to its message's length and its index."""
    client, server = _pair()
    first, _ = client.seal([b"h1", b"b1"])
    second, _ = client.seal([b"h2"])
    wire = _wire(first) + _wire(second)
    # the records: [total][len][h1][len][b1] [total][len][h2]: make the first message end after h1
    (l1,) = struct.unpack_from("<I", wire, 4)
    forged = struct.pack("<I", 4 + l1) + bytes(wire[4:8 + l1])
    rest_first = bytes(wire[8 + l1:struct.unpack_from("<I", wire, 0)[0] + 4])
    forged += struct.pack("<I", len(rest_first)) + rest_first
    with pytest.raises(seal.SealError):
        Reader(1 << 20, session=server).feed(bytearray(forged))


def test_each_direction_and_connection_has_its_own_keys():
    client, server = _pair()
    other_client, _ = _pair()  # another connection: other ephemeral keys
    wire = _wire(other_client.seal([b"x"])[0])
    with pytest.raises(seal.SealError):
        Reader(1 << 20, session=server).feed(wire)
    # a server's own message does not open as the client's
    back = _wire(server.seal([b"y"])[0])
    with pytest.raises(seal.SealError):
        Reader(1 << 20, session=seal.Session(b"\0" * 32, KEY, b"s" * 32, b"c" * 32, b"w0", client=False)).feed(back)


def test_a_large_message_split_anywhere_is_read_into_its_own_buffer():
    body = bytes(range(256)) * ((BIG_MESSAGE * 2) // 256)
    wire = b"".join(bytes(b) for b in frame([b"h", body]))
    for cut in (5, 100, BIG_MESSAGE, len(wire) - 1):
        r = Reader(1 << 24)
        chunk = memoryview(bytearray(1 << 16))
        got, pos = [], 0
        view = r.into(chunk)
        n = min(cut, len(view))
        view[:n] = wire[:n]
        got += r.got(view, n)
        pos = n
        while pos < len(wire):
            view = r.into(chunk)
            n = min(len(view), len(wire) - pos)
            view[:n] = wire[pos:pos + n]
            got += r.got(view, n)
            pos += n
        assert len(got) == 1 and bytes(got[0][1]) == body, cut


def test_a_stranger_that_sends_garbage_to_a_sealed_lane_gets_no_answer_but_the_greeting(server):
    van, address, got, sealed = server
    s = _raw(address)
    hello = s.recv(1024)
    assert MAGIC in hello
    s.sendall(b"".join(bytes(b) for b in frame([MAGIC, b"w0", b"n" * 32, b"p" * 32] + ([b"k" * 32] if sealed else []))))
    deadline = time.monotonic() + 5
    rest = b""
    while time.monotonic() < deadline:
        try:
            more = s.recv(1024)
        except (ConnectionResetError, socket.timeout):
            break
        if not more:
            break
        rest += more
    assert rest == b"" and got == []
    s.close()


def test_a_worker_van_carries_its_dealer_messages_over_an_adopted_lane(server):
    """Van.adopt_lane: what the worker sends on its DEALER goes by the lane and the answers come back to the
    DEALER's handler, large ones whole."""
    van, address, got, sealed = server
    answers: list = []
    done = threading.Event()
    worker = Van("sealed-test-worker")
    port = van._sockets["r"].getsockopt_string(__import__("zmq").LAST_ENDPOINT).rsplit(":", 1)[1]

    def on_answer(msg):
        answers.append((msg.header.round, bytes(msg.body_view()[:8]), len(msg.body_view())))
        if len(answers) == 3:
            done.set()

    worker.connect_dealer("s0", f"tcp://127.0.0.1:{port}", b"w0", on_answer)
    client = LaneClient(address, b"w0", KEY, 5, sealed=sealed)
    worker.adopt_lane("s0", client.detach())
    worker.start()
    try:
        big = np.arange(3 << 20, dtype=np.uint8)
        for rnd, body in enumerate([b"abcdefgh", bytes(big), b"12345678"]):
            worker.send("s0", _push(rnd=rnd, nbytes=len(body)), [body])
        assert done.wait(10), answers
        assert sorted(answers) == [(0, b"abcdefgh", 8), (1, bytes(big[:8]), big.nbytes), (2, b"12345678", 8)]
        assert all(identity == b"w0" for identity, _, _ in got)
    finally:
        worker.stop()


def test_a_worker_reaches_a_colocated_server_over_its_abstract_socket_only_when_it_answers():
    """cluster.address.server_address: a server advertised at a non-loopback address is reached over its ipc
    socket when that socket answers from this network namespace (a colocated server), else over TCP: a ZeroMQ
    connect to a name nobody listens on would wait forever."""
    import os

    from pushpull.cluster.address import server_address

    name = f"pushpull-test-{os.getpid()}-{os.urandom(4).hex()}"
    book = {"host": "10.1.2.3", "port": 4242, "ipc": f"ipc://@{name}"}
    assert server_address(book, True) == "tcp://10.1.2.3:4242"  # nobody listens: another host's server
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    try:
        assert server_address(book, True) == f"ipc://@{name}"
        assert server_address(book, False) == "tcp://10.1.2.3:4242"  # PUSHPULL_LOCAL_IPC=0
    finally:
        listener.close()


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain"])
def test_a_push_ack_goes_beside_the_lane_and_the_pull_answer_on_it(sealed):
    """A PUSH_ACK returns credit: sent to BesideLane(identity) it takes the ROUTER's own connection, so it
    never queues behind pull answers on the worker's data lane; the answer itself stays on the lane."""
    from pushpull.transport.van import BesideLane

    van = Van("beside-test")
    acks_sent = []

    def handle(identity, msg):
        h = msg.header
        if h.type == MsgType.PUSH:
            before = van._zmq_ops
            van.send("r", Header(MsgType.PUSH_ACK, key=h.key, round=h.round), identity=BesideLane(identity))
            acks_sent.append(van._zmq_ops - before)  # sent on the I/O thread: at once, through ZeroMQ
            before = van._zmq_ops
            van.send("r", Header(MsgType.PULL_RESP, key=h.key, round=h.round), [msg.body_view()], identity=identity)
            acks_sent.append(van._zmq_ops - before)

    van.bind_router("r", "127.0.0.1", 0, handle)
    address = van.bind_lane("r", "127.0.0.1", KEY, max_message_bytes=64 << 20, sealed=sealed)
    van.start()
    worker = Van("beside-test-worker")
    got: list = []
    done = threading.Event()

    def on_answer(msg):
        got.append((msg.header.type, msg.header.round))
        if len(got) == 4:
            done.set()

    port = van._sockets["r"].getsockopt_string(__import__("zmq").LAST_ENDPOINT).rsplit(":", 1)[1]
    worker.connect_dealer("s0", f"tcp://127.0.0.1:{port}", b"w0", on_answer)
    worker.adopt_lane("s0", LaneClient(address, b"w0", KEY, 5, sealed=sealed).detach())
    worker.start()
    try:
        time.sleep(0.2)  # the DEALER's handshake: the ROUTER learns its identity
        for rnd in range(2):
            worker.send("s0", _push(rnd=rnd, nbytes=2 << 20), [bytes(2 << 20)])
        assert done.wait(10), got
        assert sorted(got) == sorted([(MsgType.PULL_RESP, 0), (MsgType.PULL_RESP, 1), (MsgType.PUSH_ACK, 0),
                                      (MsgType.PUSH_ACK, 1)])
        deadline = time.monotonic() + 5
        while len(acks_sent) < 4 and time.monotonic() < deadline:  # the handler counts after its last send
            time.sleep(0.01)
        assert acks_sent == [1, 0, 1, 0]  # each ack one ZeroMQ send, each answer none (the lane)
    finally:
        worker.stop()
        van.stop()
