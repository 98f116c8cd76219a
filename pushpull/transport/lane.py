"""The direct lane: plain TCP between a worker's calling thread and a server's I/O thread.

Why: a ZeroMQ message never goes from one Python thread to the socket itself. libzmq hands it to its own
I/O thread, which writes it; at the other end libzmq's I/O thread reads it and wakes the Python thread.
A small push_pull crosses four such hops (two pushes, two answers), so it pays eight thread wake-ups
that do no work of ours; on two shared cores a worker -> server -> worker exchange of one float through
ZeroMQ took 195 us where the same exchange over plain TCP sockets took 65 us (the floor gloo's
all_reduce gets, as gloo writes to its socket from the caller's thread). The lane carries the same
messages as the ZeroMQ connection (the header and body frames of :mod:`pushpull.transport.protocol`,
batches included) and feeds the server's same handler, so every check (sender rank against the
connection's identity, key, round, generation, dtype and length) applies unchanged.

Where it listens: on a server whose advertised address is loopback, on an abstract Unix socket
(Linux: scoped to the network namespace as loopback is, no file left behind), which the kernel
delivers with less work than TCP (a one-float exchange of three processes: 50 against 60-85 us);
elsewhere on TCP beside the ROUTER. Its address, ``unix:@NAME`` or ``tcp://HOST:PORT``, goes to
the workers in the address book.

Framing: a message is its length (u32, little-endian, the bytes after it), then each frame as its
length (u32) and bytes. Where it is offered: only where the job's ZeroMQ traffic is not encrypted
anyway (PLAIN on loopback, PUSHPULL_AUTH=plain or none; :meth:`pushpull.transport.security.JobAuth.lane_allowed`),
so it never downgrades CURVE.

Who may use it: the connection proves it holds the job secret before anything of it reaches a handler.
The server opens with a random nonce; the client answers with its identity, a nonce of its own and
HMAC-SHA256(lane key, both nonces, identity); the server answers with an HMAC over the same nonces under
another label, which proves to the client that it talks to a member too. A peer that fails, sends more
than :data:`HELLO_MAX` bytes before proving itself, or stays silent for :data:`HELLO_TIMEOUT_S`, is
disconnected. After that, messages are bounded by the server's ``max_message_bytes``. Like a ROUTER,
a lane admits one live connection per identity.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import socket
import struct
import sys
import time
from typing import Callable

import numpy as np

from pushpull.transport import seal

log = logging.getLogger(__name__)

MAGIC = b"pushpull-lane/1"
_U32 = struct.Struct("<I")
NONCE_BYTES = 32
HELLO_MAX = 512  # bytes a connection may send before it has proved it holds the job secret
HELLO_TIMEOUT_S = 10.0
MAX_PENDING_HELLOS = 64  # unproven connections held at once; more are closed at accept
DEFAULT_MAX_MESSAGE = 64 << 20  # a message's bytes when the server sets no PUSHPULL_MAX_MESSAGE_BYTES
SEND_TIMEOUT_S = 10.0  # a worker's write to a server that reads nothing for this long fails
OUTBOX_MAX = 256 << 20  # bytes queued for one slow reader before its connection is dropped
_CHUNK = 1 << 18  # bytes asked of one recv
# poll flags as the owner's poller reports them (ZeroMQ's zmq_poll, which also polls plain descriptors)
READ, WRITE, ERROR = 1, 2, 4


def _connect(address: str, timeout: float) -> socket.socket:
    if address.startswith("unix:@"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + address[len("unix:@"):])
        except BaseException:
            sock.close()
            raise
        return sock
    if not address.startswith("tcp://"):
        raise LaneError(f"lane address {address!r} is neither unix:@NAME nor tcp://HOST:PORT")
    host, port = address[len("tcp://"):].rsplit(":", 1)
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))


class LaneError(ConnectionError):
    """The lane's peer broke the framing or the handshake; the text says how."""


def lane_key(auth) -> bytes:
    """The HMAC key of a job's lanes (``auth``: a JobAuth, or None with PUSHPULL_AUTH=none: an empty key,
    so the handshake keeps out only what is not a pushpull lane, as that setting asks)."""
    return auth.lane_key if auth is not None else b""


def lane_sealed(auth, host: str) -> bool:
    """Whether lanes to a server advertised as ``host`` are encrypted (``auth``: a JobAuth, or None)."""
    return auth is not None and auth.lane_sealed(host)


def _proof(key: bytes, label: bytes, snonce: bytes, cnonce: bytes, identity: bytes) -> bytes:
    return hmac.new(key, MAGIC + label + snonce + cnonce + identity, hashlib.sha256).digest()


def frame(parts) -> list:
    """The buffers of one lane message carrying ``parts`` (bytes-like, or zmq.Frame), for ``sendmsg``."""
    return _framed(parts)[0]


def _framed(parts) -> tuple[list, int]:
    """:func:`frame`'s buffers and their bytes in all."""
    out = [b""]
    total = 0
    for p in parts:
        view = memoryview(p)
        n = view.nbytes
        out.append(_U32.pack(n))
        out.append(view)
        total += 4 + n
    out[0] = _U32.pack(total)
    return out, total + 4


BIG_MESSAGE = 64 << 10  # a message of more bytes that one read does not complete is read into its own buffer
COPY_BELOW = 64 << 10  # frames of fewer bytes are copied when queued (pyzmq's rule); larger ones are referenced


def _uninitialised(n: int):
    """A writable buffer of ``n`` bytes that is not zeroed first (bytearray(n) writes every byte once more
    than the read that fills it)."""
    return np.empty(n, np.uint8)


class Reader:
    """Reassembles lane messages from a byte stream; each comes out as a list of frames (memoryviews of a
    buffer no later read changes: the read's copy, or, for a message that spanned reads, its own).

    A large message (over :data:`BIG_MESSAGE`) that one read does not complete gets a buffer of its own, and
    the reads after that land straight in it (:meth:`into`): the kernel's copy is its only one. With a
    ``session`` (pushpull.transport.seal), frames are sealed records, opened in place."""

    def __init__(self, max_message: int, session=None):
        self.max_message = max_message
        self.session = session
        self.buf = bytearray()
        self.body = None  # a large message being read into its own buffer
        self.body_view: memoryview | None = None
        self.have = 0

    def into(self, chunk_view: memoryview) -> memoryview:
        """Where the next read should land: the rest of a large message's own buffer, else ``chunk_view``."""
        if self.body is not None:
            return self.body_view[self.have:]
        return chunk_view

    def got(self, view: memoryview, n: int) -> list:
        """``n`` bytes were read into ``view`` (what :meth:`into` gave); the messages they complete."""
        if self.body is None:
            return self.feed(view[:n])
        self.have += n
        body = self.body
        if self.have < len(body):
            return []
        self.body = self.body_view = None
        return [self._message(body, 0, len(body), len(body))]

    def feed(self, data) -> list:
        """Add ``data``; the messages it completes. Raises LaneError on a message over the limit or
        frames that do not add up to its length (pushpull.transport.seal.SealError: a record that fails).
        Every byte is copied at most once: the complete messages of a read into one object of their own
        (the read's buffer is reused), the start of a large one into its own buffer."""
        kind = bytearray if self.session is not None else bytes  # sealed records are opened in place
        if self.buf:
            self.buf += data
            data = self.buf
        view = memoryview(data)
        try:
            spans, off, end = [], 0, len(view)
            while end - off >= 4:
                (total,) = _U32.unpack_from(view, off)
                if total > self.max_message:
                    raise LaneError(f"a message of {total} bytes (limit {self.max_message})")
                if end - off - 4 < total:
                    break
                spans.append((off + 4, total))
                off += 4 + total
            out = []
            if spans:
                whole = kind(view[:off])  # the complete messages' copy: their frames are views of it
                out = [self._message(whole, i, i + total, total) for i, total in spans]
            rest = end - off
            if rest >= 4 and total > BIG_MESSAGE:  # read the rest straight into the message's own buffer
                body = _uninitialised(total)
                self.body_view = memoryview(body)
                self.body_view[:rest - 4] = view[off + 4:end]
                self.body, self.have = body, rest - 4
                rest = 0
            tail = bytearray(view[off:]) if rest else bytearray()
        finally:
            view.release()
        self.buf = tail
        return out

    def _message(self, body, i: int, stop: int, total: int) -> list:
        view, frames = memoryview(body), []
        while i < stop:
            if i + 4 > stop:
                raise LaneError("a frame length cut short")
            (n,) = _U32.unpack_from(body, i)
            if i + 4 + n > stop:
                raise LaneError(f"a frame of {n} bytes runs past its message")
            frames.append(view[i + 4:i + 4 + n])
            i += 4 + n
        if self.session is not None:
            return self.session.open(total, frames)
        return frames


def _drop_sent(bufs: list, sent: int) -> None:
    """Remove from the front of ``bufs`` the ``sent`` bytes a ``sendmsg`` took (a buffer taken in part is
    replaced by a view of its rest)."""
    while bufs and sent >= memoryview(bufs[0]).nbytes:
        sent -= memoryview(bufs[0]).nbytes
        bufs.pop(0)
    if sent:
        bufs[0] = memoryview(bufs[0])[sent:]


def _send_all(sock: socket.socket, bufs: list, nbytes: int) -> None:
    """Blocking ``sendmsg`` of the ``nbytes`` bytes of ``bufs`` (bounded by the socket's timeout)."""
    sent = sock.sendmsg(bufs)
    if sent == nbytes:  # the usual case: the kernel took the whole message at once
        return
    _drop_sent(bufs, sent)
    while bufs:
        _drop_sent(bufs, sock.sendmsg(bufs))


def _hold(parts) -> tuple[list, int]:
    """``parts`` as kept in an outbox until the kernel takes them: small frames copied (their buffers may be
    reused, and copying them costs little), large ones by reference, as libzmq keeps a zero-copy frame (the
    senders keep them unchanged until answered); and how many bytes were copied."""
    held, copied = [], 0
    for p in parts:
        view = memoryview(p)
        if view.nbytes < COPY_BELOW and not isinstance(p, bytes):
            p = view.tobytes()
            copied += len(p)
        elif isinstance(p, bytes):
            copied += len(p)
        held.append(p)
    return held, copied


class Conn:
    """One lane connection driven by a poller (a server's, or a worker's I/O thread): reads into its
    :class:`Reader`, writes without blocking, and keeps what the kernel did not take in order. A sealed
    connection encrypts a message when the kernel has room for it, so only one message's ciphertext exists
    at a time."""

    __slots__ = ("sock", "fd", "identity", "snonce", "ephemeral", "since", "reader", "session", "queue", "head",
                 "copied", "head_copied", "head_held")

    def __init__(self, sock: socket.socket, reader: Reader, session=None, snonce: bytes = b"",
                 identity: bytes | None = None):
        self.sock = sock
        self.fd = sock.fileno()
        self.identity = identity  # a server's: set once the peer proved it holds the secret
        self.snonce = snonce
        self.ephemeral = None  # a sealed server connection's X25519 key pair until the handshake ends
        self.since = time.monotonic()
        self.reader = reader
        self.session = session
        self.queue: collections.deque = collections.deque()  # (parts, bytes copied, session) not begun yet
        self.head: list | None = None  # the buffers of the message being written
        self.copied = 0  # bytes copied into the queue and not sent yet (what a reader that reads nothing costs)
        self.head_copied = 0
        self.head_held = True  # whether the head's buffers may be kept (held, sealed, or the framing's own)

    @property
    def waiting(self) -> bool:
        """Whether bytes wait for the socket to be writable (its owner then watches it for WRITE)."""
        return bool(self.head or self.queue)

    def read(self, chunk_view: memoryview) -> list | None:
        """Read once (non-blocking); the messages completed, or None when the peer hung up. Raises
        BlockingIOError when nothing was there, OSError, LaneError."""
        view = self.reader.into(chunk_view)
        n = self.sock.recv_into(view)
        if not n:
            return None
        return self.reader.got(view, n)

    def write(self, parts) -> bool:
        """Send ``parts`` as one message, or queue what the kernel does not take now; True when bytes wait
        for the socket to be writable. Raises OSError."""
        if self.head is None and not self.queue:
            if self.session is not None:
                self.head, _ = self.session.seal(parts)
            else:
                self.head, _ = _framed(parts)
                self.head_held = False
            return self.flush()
        held, copied = _hold(parts)
        self.queue.append((held, copied, self.session))  # sealed (or not) as the connection was when queued
        self.copied += copied
        return True

    def flush(self) -> bool:
        """Write what the kernel takes; True when bytes still wait. Raises OSError."""
        while True:
            if not self.head:
                self.copied -= self.head_copied
                self.head_copied = 0
                if not self.queue:
                    self.head = None
                    return False
                parts, self.head_copied, session = self.queue.popleft()
                self.head_held = True
                self.head, _ = session.seal(parts) if session is not None else _framed(parts)
            try:
                sent = self.sock.sendmsg(self.head)
            except (BlockingIOError, InterruptedError):
                sent = 0
            _drop_sent(self.head, sent)
            if self.head:
                if not self.head_held:
                    # the kernel's buffer is full in the middle of a message written at once: what is left of
                    # its parts is held as a queued message's would be
                    self.head, _ = _hold(self.head)
                    self.head_held = True
                return True


class LaneClient:
    """A worker thread's blocking lane to one server (not thread-safe: one per thread, as a ZeroMQ socket).
    :meth:`detach` hands its proven connection to a poller instead (a worker's I/O thread)."""

    def __init__(self, address: str, identity: bytes, key: bytes, timeout: float,
                 max_message: int = DEFAULT_MAX_MESSAGE, alive: Callable[[], str | None] = lambda: None,
                 sealed: bool = False):
        """Connect to the lane at ``address`` (``unix:@NAME`` or ``tcp://HOST:PORT``) and prove membership;
        raises OSError (LaneError: the peer is no pushpull lane of this job, or ``alive()``, asked every
        quarter second while the server is silent, gave a reason to stop) after at most ``timeout`` s.
        ``sealed``: encrypt (pushpull.transport.seal); a server that offers an unencrypted lane is refused."""
        self.alive = alive
        self.identity = identity
        self.pending: list = []  # messages read beyond the one asked for
        self.chunk = bytearray(_CHUNK)  # reads land here (a fresh _CHUNK-byte object per read costs more)
        self.chunk_view = memoryview(self.chunk)
        self.session = None
        self.sock = _connect(address, timeout)
        try:
            self.reader = Reader(max(max_message, HELLO_MAX))
            deadline = time.monotonic() + timeout
            hello = self._expect(deadline, "its greeting")
            if len(hello) not in (2, 3) or bytes(hello[0]) != MAGIC or len(hello[1]) != NONCE_BYTES:
                raise LaneError("the server's greeting is not a pushpull lane's")
            if sealed != (len(hello) == 3):
                raise LaneError("the server offers an unencrypted lane where this job encrypts" if sealed else
                                "the server offers an encrypted lane where this job does not encrypt "
                                "(PUSHPULL_AUTH differs between machines?)")
            snonce, cnonce = bytes(hello[1]), os.urandom(NONCE_BYTES)
            if sealed:
                mine = seal.Ephemeral()
                spub = bytes(hello[2])
                signed = identity + spub + mine.public
                _send_all(self.sock, *_framed([MAGIC, identity, cnonce, _proof(key, b"client sealed", snonce, cnonce,
                                                                                 signed), mine.public]))
                want = _proof(key, b"server sealed", snonce, cnonce, signed)
            else:
                _send_all(self.sock, *_framed([MAGIC, identity, cnonce,
                                               _proof(key, b"client", snonce, cnonce, identity)]))
                want = _proof(key, b"server", snonce, cnonce, identity)
            ok = self._expect(deadline, "its answer to our credentials (another job's secret?)")
            if len(ok) != 2 or bytes(ok[0]) != MAGIC or not hmac.compare_digest(bytes(ok[1]), want):
                raise LaneError("the server did not prove it holds the job secret")
            if sealed:
                self.session = seal.Session(mine.shared(spub), key, snonce, cnonce, identity, client=True)
                self.reader.session = self.session
        except BaseException:
            self.sock.close()
            raise

    def _expect(self, deadline: float, what: str) -> list:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LaneError(f"the server did not send {what} in time")
            self.sock.settimeout(min(left, 0.25))
            msg = self.recv()
            if msg is not None:
                return msg
            reason = self.alive()
            if reason:
                raise LaneError(f"gave up waiting for {what}: {reason}")

    def send(self, parts) -> None:
        _send_all(self.sock, *(self.session.seal(parts) if self.session is not None else _framed(parts)))

    def recv(self):
        """The next message's frames, or None when the socket's timeout passed first (a part of a message
        read meanwhile is kept). Raises LaneError when the server closed the connection."""
        if self.pending:
            return self.pending.pop(0)
        view = self.reader.into(self.chunk_view)
        try:
            n = self.sock.recv_into(view)
        except (socket.timeout, BlockingIOError):
            return None
        if not n:
            raise LaneError("the server closed the connection")
        msgs = self.reader.got(view, n)
        if not msgs:
            return None
        self.pending = msgs[1:]
        return msgs[0]

    def detach(self) -> Conn:
        """This proven lane as a non-blocking :class:`Conn` for a poller; the client is spent."""
        if self.pending:
            raise LaneError("the server sent messages before it was asked anything")
        sock, self.sock = self.sock, None
        sock.settimeout(None)
        sock.setblocking(False)
        return Conn(sock, self.reader, self.session, identity=self.identity)

    def settimeout(self, seconds: float) -> None:
        """Reads that give up after ``seconds`` (``recv`` then returns None), and writes after SEND_TIMEOUT_S.
        The kernel keeps the time (SO_RCVTIMEO on a blocking socket): a timeout kept by Python would cost a
        poll() before every read and write."""
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(SEND_TIMEOUT_S))

    def close(self) -> None:
        try:
            if self.sock is not None:
                self.sock.close()
        except OSError:
            pass


class LaneServer:
    """A server's lane listener and its connections; driven by the owning Van on its I/O thread (it
    registers the descriptors with the Van's poller and calls :meth:`ready` with their events)."""

    def __init__(self, host: str, key: bytes, max_message: int, watch: Callable[[int, int], None],
                 deliver: Callable[[bytes, list], None], peer_log, local: bool = False,
                 advertised: str | None = None, sealed: bool = False):
        """Listen on ``host`` (TCP, any port; ``"*"``: every interface) and give ``advertised`` (default
        ``host``) as the address workers connect to, or with ``local`` (the server is reached on loopback) on an
        abstract Unix socket where the system has them. ``watch(fd, events)``: (re)register ``fd`` for
        READ / WRITE (0: unregister); ``deliver(identity, frames)``: a message from a proven connection;
        ``peer_log``: a RateLimitedLog; ``sealed``: every connection is encrypted (pushpull.transport.seal)."""
        self.key = key
        self.sealed = sealed
        self.max_message = max_message or DEFAULT_MAX_MESSAGE
        self.watch = watch
        self.deliver = deliver
        self.peer_log = peer_log
        self.tcp = not (local and sys.platform.startswith("linux"))
        if self.tcp:
            self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(("" if host == "*" else host, 0))
            port = self.listener.getsockname()[1]
            shown = advertised or host
            self.address = f"tcp://[{shown}]:{port}" if ":" in shown else f"tcp://{shown}:{port}"
        else:
            name = f"pushpull-lane-{os.getpid()}-{os.urandom(8).hex()}"
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind("\0" + name)
            self.address = "unix:@" + name
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.chunk = bytearray(_CHUNK)  # every connection's reads land here first (one I/O thread)
        self.chunk_view = memoryview(self.chunk)
        self.conns: dict[int, Conn] = {}  # fd -> connection
        self.by_identity: dict[bytes, Conn] = {}

    def start(self) -> None:
        """Start accepting (once the owner can be told about descriptors)."""
        self.watch(self.listener.fileno(), READ)

    def owns(self, fd) -> bool:
        return fd == self.listener.fileno() or fd in self.conns

    def ready(self, fd: int, events: int) -> None:
        if fd == self.listener.fileno():
            self._accept()
            return
        c = self.conns.get(fd)
        if c is None:
            return
        if events & WRITE and c.waiting:
            self._flush(c)
        if events & (READ | ERROR) and c.fd in self.conns:
            self._read(c)

    def _accept(self) -> None:
        for _ in range(16):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.peer_log.warning(("lane", "accept"), "lane: accept failed: %s", e)
                return
            if sum(1 for c in self.conns.values() if c.identity is None) >= MAX_PENDING_HELLOS:
                sock.close()
                self.peer_log.warning(("lane", "hellos"), "lane: %d connections have not proved themselves yet; "
                                      "refused another", MAX_PENDING_HELLOS)
                continue
            sock.setblocking(False)
            if self.tcp:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = Conn(sock, Reader(HELLO_MAX), snonce=os.urandom(NONCE_BYTES))
            self.conns[c.fd] = c
            self.watch(c.fd, READ)
            if self.sealed:
                c.ephemeral = seal.Ephemeral()
                self._write(c, [MAGIC, c.snonce, c.ephemeral.public])
            else:
                self._write(c, [MAGIC, c.snonce])

    def _read(self, c: Conn) -> None:
        for _ in range(16):  # until the socket is empty, bounded so that one busy peer cannot starve the others
            try:
                msgs = c.read(self.chunk_view)
            except (BlockingIOError, InterruptedError):
                return
            except (OSError, LaneError) as e:  # SealError is an OSError
                self.drop(c, f"read failed: {e}" if not isinstance(e, LaneError) else str(e))
                return
            if msgs is None:
                self.drop(c, None)
                return
            for frames in msgs:
                if c.identity is None:
                    if not self._hello(c, frames):
                        return
                    continue
                self.deliver(c.identity, frames)
                if c.fd not in self.conns:
                    return
            if c.identity is None or c.reader.body is None:  # go on only while a large message fills up
                return

    def _hello(self, c: Conn, frames: list) -> bool:
        want = 5 if self.sealed else 4
        if (len(frames) != want or bytes(frames[0]) != MAGIC or len(frames[2]) != NONCE_BYTES
                or not 0 < len(frames[1]) <= 64 or (self.sealed and len(frames[4]) != seal.PUBLIC_BYTES)):
            self.drop(c, "not a pushpull lane greeting" + (" (an unencrypted lane where this job encrypts?)"
                                                            if self.sealed and len(frames) == 4 else ""))
            return False
        identity, cnonce = bytes(frames[1]), bytes(frames[2])
        if self.sealed:
            cpub = bytes(frames[4])
            signed = identity + c.ephemeral.public + cpub
            proven = hmac.compare_digest(bytes(frames[3]), _proof(self.key, b"client sealed", c.snonce, cnonce, signed))
        else:
            signed = identity
            proven = hmac.compare_digest(bytes(frames[3]), _proof(self.key, b"client", c.snonce, cnonce, identity))
        if not proven:
            self.drop(c, "wrong credentials (no PUSHPULL_SECRET, or another job's)")
            return False
        if identity in self.by_identity:
            self.drop(c, f"identity {identity!r} is already connected")
            return False
        session = None
        if self.sealed:
            try:
                session = seal.Session(c.ephemeral.shared(cpub), self.key, c.snonce, cnonce, identity, client=False)
            except seal.SealError as e:
                self.drop(c, str(e))
                return False
            c.ephemeral = None
        c.identity = identity
        c.reader.max_message = self.max_message
        self.by_identity[identity] = c
        # the answer goes out unsealed (it proves the server to the client); every message after it is sealed
        self._write(c, [MAGIC, _proof(self.key, b"server sealed" if self.sealed else b"server", c.snonce, cnonce,
                                      signed)])
        if session is not None:
            c.session = session
            c.reader.session = session
        return True

    def send(self, identity: bytes, parts) -> bool:
        """Send one message to ``identity``'s connection; False when it has none."""
        c = self.by_identity.get(identity)
        if c is None:
            return False
        self._write(c, parts)
        return True

    def _write(self, c: Conn, parts) -> None:
        """Write ``parts`` to ``c`` as one message, or what the kernel does not take now later."""
        waiting = c.waiting
        try:
            more = c.write(parts)
        except OSError as e:
            self.drop(c, f"write failed: {e}")
            return
        if more and not waiting:
            self.watch(c.fd, READ | WRITE)
        if c.copied > OUTBOX_MAX:
            self.drop(c, f"it has not read {c.copied} bytes sent to it")

    def _flush(self, c: Conn) -> None:
        try:
            more = c.flush()
        except OSError as e:
            self.drop(c, f"write failed: {e}")
            return
        if not more:
            self.watch(c.fd, READ)

    def check_hellos(self) -> None:
        """Close connections that have not proved themselves within HELLO_TIMEOUT_S (a timer calls this)."""
        now = time.monotonic()
        for c in [c for c in self.conns.values() if c.identity is None and now - c.since > HELLO_TIMEOUT_S]:
            self.drop(c, f"no valid greeting within {HELLO_TIMEOUT_S:g}s")

    def drop(self, c: Conn, why: str | None) -> None:
        """Close ``c`` (``why``: logged, rate-limited per peer, unless it simply hung up)."""
        if self.conns.pop(c.fd, None) is None:
            return
        if c.identity is not None and self.by_identity.get(c.identity) is c:
            del self.by_identity[c.identity]
        self.watch(c.fd, 0)
        if why:
            self.peer_log.warning(("lane", c.identity or "unproven"), "lane: closed the connection of %s: %s",
                                  c.identity or "an unproven peer", why)
        try:
            c.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        for c in list(self.conns.values()):
            self.drop(c, None)
        self.watch(self.listener.fileno(), 0)
        self.listener.close()
