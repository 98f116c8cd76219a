"""The direct path: a small synchronous push_pull sent and answered on the caller's own thread.

Why: through the engine, one push_pull of one float crosses six thread hand-offs (caller -> I/O
thread -> libzmq -> ... -> libzmq -> I/O thread -> caller), each a wake-up, and waits for a Python
pass of the I/O loop at each end. A metric average or a model with hundreds of tiny tensors pays
that per call (2.7x gloo's all_reduce of one float). A caller that blocks anyway can do the
exchange itself: its own DEALER socket per server (ZeroMQ sockets belong to one thread, so one per
thread, each with an identity of its own), one PUSH that carries the pull, one blocking receive.
The server answers whichever identity pushed, so it needs nothing new.

Where a server offers a direct lane (:mod:`pushpull.transport.lane`: plain TCP where its ZeroMQ
traffic is not encrypted either), the exchange goes over it instead of the DEALER: the caller's
thread then writes to and reads from the kernel's socket itself, without libzmq's I/O thread at
either end (four thread wake-ups fewer per push_pull). A lane that cannot be opened is logged
once and that server is used through its DEALER.

Used only where it cannot change the outcome: the tensor is declared and ready, has one
partition, no compression, no tracing, nothing else of it is in flight. Everything else goes
through the engine, which keeps ordering, credit and priorities for the bulk of a step.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

import zmq
import zmq.backend

from pushpull.cluster.nodes import worker_identity
from pushpull.transport.lane import LaneClient, lane_key, lane_sealed
from pushpull.transport.van import tcp_host
from pushpull.transport.protocol import (
    Flags, Header, MsgType, decode_json, is_answer, messages,
)

_recv = zmq.backend.Socket.recv
_send = zmq.backend.Socket.send
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
LIVENESS_S = 0.25  # how often a blocked call checks whether the cluster is still alive
CONNECT_TIMEOUT_S = 10.0  # opening a lane (TCP connect and handshake)
LANE_GRACE_S = 5.0  # after a lane broke, how long the membership may take to say why (see _broken)
log = logging.getLogger(__name__)


class DirectPath:
    """Per-thread sockets to the servers, for :meth:`pushpull.worker.direct_call.DirectCalls.push_pull_now`."""

    _thread_ids = itertools.count()

    def __init__(self, ctx: zmq.Context, rank: int, servers: dict[str, str], auth=None,
                 lanes: dict[str, str] | None = None):
        """``lanes``: van socket name -> lane address of the servers that offer a direct lane."""
        self.ctx = ctx
        self.auth = auth  # the job's credentials, as on the engine's own sockets
        self.rank = rank
        self.servers = servers  # van socket name ("s0") -> tcp address
        self.lanes = dict(lanes or {})
        self.use_lanes = True  # False: every exchange over ZeroMQ (pushpull bench latency compares both)
        self._no_lane: set[str] = set()  # servers whose lane could not be opened: their DEALER serves
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list = []  # zmq sockets and lane clients of every thread, closed by close()
        self.closed = False
        # per server: how many times it was replaced (a lost server's replacement); a thread's socket or lane
        # opened before is closed by that thread and opened again to the new address
        self._epoch: dict[str, int] = {}

    def replace(self, sock: str, address: str, lane: str | None) -> None:
        """Server ``sock`` is at ``address`` (and its lane at ``lane``, None: none) from now on."""
        with self._lock:
            self.servers[sock] = address
            if lane:
                self.lanes[sock] = lane
            else:
                self.lanes.pop(sock, None)
            self._no_lane.discard(sock)
            self._epoch[sock] = self._epoch.get(sock, 0) + 1

    def _fresh(self, held: dict, sock: str):
        """This thread's socket or lane to ``sock`` in ``held`` (as (epoch, it)), or None: absent, or opened
        before the server was replaced (then closed here, by the thread that owns it)."""
        got = held.get(sock)
        if got is None:
            return None
        epoch, c = got
        if epoch == self._epoch.get(sock, 0):
            return c
        del held[sock]
        with self._lock:
            if c in self._open:
                self._open.remove(c)
        c.close(0) if isinstance(c, zmq.Socket) else c.close()
        return None

    def _lane(self, sock: str, alive) -> LaneClient | None:
        """This thread's lane to server ``sock``, opened on first use; None where there is none. Opening it
        raises ConnectionError with ``alive()``'s reason when the job fails meanwhile."""
        if not self.use_lanes:
            return None
        lanes = getattr(self._local, "lanes", None)
        if lanes is None:
            lanes = self._local.lanes = {}
        c = self._fresh(lanes, sock)
        if c is not None or sock not in self.lanes or sock in self._no_lane:
            return c
        if getattr(self._local, "tid", None) is None:
            self._local.tid = next(self._thread_ids)
        with self._lock:  # one consistent view: a replacement may change them meanwhile (replace())
            epoch, address, server = self._epoch.get(sock, 0), self.lanes.get(sock), self.servers.get(sock)
        if address is None:
            return None
        try:
            host = tcp_host(server) if server is not None else "127.0.0.1"
            c = LaneClient(address, worker_identity(self.rank, f"l{self._local.tid}"), lane_key(self.auth),
                           CONNECT_TIMEOUT_S, alive=alive, sealed=lane_sealed(self.auth, host))
        except OSError as e:
            reason = alive()
            if reason:
                raise ConnectionError(reason) from None
            log.warning("rank %d: the direct lane to server %s at %s failed (%s); its direct calls go over "
                        "ZeroMQ", self.rank, sock[1:], address, e)
            with self._lock:
                if self._epoch.get(sock, 0) == epoch:  # not a replacement's lane, which may well open
                    self._no_lane.add(sock)
            return None
        c.settimeout(LIVENESS_S)
        with self._lock:
            if self.closed:
                c.close()
                raise zmq.ZMQError(zmq.ETERM)
            self._open.append(c)
        lanes[sock] = (epoch, c)
        return c

    def _socket(self, sock: str) -> zmq.Socket:
        socks = getattr(self._local, "socks", None)
        if socks is None:
            socks = self._local.socks = {}
        s = self._fresh(socks, sock)
        if s is None:
            if getattr(self._local, "tid", None) is None:
                self._local.tid = next(self._thread_ids)
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, int(LIVENESS_S * 1000))
            s.setsockopt(zmq.IDENTITY, worker_identity(self.rank, f"d{self._local.tid}"))
            with self._lock:  # one consistent view: a replacement may change it meanwhile (replace())
                epoch, address = self._epoch.get(sock, 0), self.servers[sock]
            if self.auth is not None:
                self.auth.connect(s, tcp_host(address))
            s.connect(address)
            with self._lock:
                if self.closed:
                    s.close(0)
                    raise zmq.ZMQError(zmq.ETERM)
                self._open.append(s)
            socks[sock] = (epoch, s)
        return s

    def exchange(self, sock: str, header: Header, payload, timeout: float, alive,
                 want: MsgType = MsgType.PULL_RESP) -> memoryview:
        """Send ``header`` + ``payload`` (None: no body) to server ``sock`` and return the body of its
        ``want`` answer for the same key and round. Raises TimeoutError after ``timeout`` s, RuntimeError with
        the server's text on an ERROR, and ``alive()``'s reason (checked every LIVENESS_S) as ConnectionError."""
        lane = self._lane(sock, alive) if self.lanes else None
        if lane is not None:
            return self._exchange_lane(lane, sock, header, payload, timeout, alive, want)
        s = self._socket(sock)
        if payload is None:
            _send(s, header.pack(), 0, copy=True)
        else:
            _send(s, header.pack(), _SNDMORE, copy=True)
            _send(s, payload, 0, copy=True)
        deadline = time.monotonic() + timeout
        while True:
            try:  # a blocking receive bounded by RCVTIMEO: no poller built per call
                frames = [_recv(s, 0, copy=False)]
            except zmq.Again:
                self._waited(sock, timeout, deadline, alive)
                continue
            while frames[-1].more:
                frames.append(_recv(s, _NOBLOCK, copy=False))
            body = self._answer(frames, header, want)
            if body is not None:
                return body

    def _exchange_lane(self, lane: LaneClient, sock: str, header: Header, payload, timeout: float, alive,
                       want: MsgType) -> memoryview:
        """:meth:`exchange` over this thread's lane: a blocking write, then blocking reads of LIVENESS_S."""
        deadline = time.monotonic() + timeout
        try:
            lane.send((header.pack(),) if payload is None else (header.pack(), payload))
        except OSError as e:
            self._broken(sock, lane, e, deadline, alive)
        while True:
            try:
                frames = lane.recv()
            except OSError as e:
                self._broken(sock, lane, e, deadline, alive)
            if frames is None:
                self._waited(sock, timeout, deadline, alive)
                continue
            body = self._answer(frames, header, want)
            if body is not None:
                return body

    def _broken(self, sock: str, lane: LaneClient, e: OSError, deadline: float, alive) -> None:
        """The lane to ``sock`` failed (closed, reset, a write that timed out): forget it, so that the next
        call opens a new one, and raise ConnectionError. A server closes its lanes when it stops because
        the job failed or changed, which the membership says a moment later: waiting up to LANE_GRACE_S
        for ``alive()``'s reason names the real culprit (the dead worker, the lost server, the new
        generation) instead of the lane."""
        self._local.lanes.pop(sock, None)
        with self._lock:
            if lane in self._open:
                self._open.remove(lane)
        lane.close()
        until = min(deadline, time.monotonic() + LANE_GRACE_S)
        while True:
            reason = alive()
            if reason:
                raise ConnectionError(reason) from None
            if time.monotonic() >= until:
                break
            time.sleep(0.02)
        raise ConnectionError(f"the direct lane to server {sock[1:]} broke: {e}") from None

    @staticmethod
    def _waited(sock: str, timeout: float, deadline: float, alive) -> None:
        """A receive waited LIVENESS_S: raise if the cluster failed or the call's time is up."""
        reason = alive()
        if reason:
            raise ConnectionError(reason) from None
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer from server {sock[1:]} within {timeout:g}s") from None

    @staticmethod
    def _answer(frames: list, header: Header, want: MsgType):
        """The body of the answer to ``header`` in ``frames`` (one received message), or None when it is
        something else (malformed, or late for an earlier call)."""
        if len(frames) == 2:  # the usual answer (header, body), tested on the header's fields
            first, body = frames
            if is_answer(first if first.__class__ is memoryview else first.buffer, want, header.key, header.round,
                         header.gen):
                return body if body.__class__ is memoryview else body.buffer
        for m in messages(frames):
            h = m.header
            if h.key != header.key:
                continue  # a late answer to an earlier call that timed out
            if h.type == MsgType.ERROR:
                raise RuntimeError(decode_json(m.body()).get("error", "unknown server error"))
            if h.gen != header.gen:
                continue  # an answer from before the workers changed
            if h.type == want and h.round == header.round and not h.flags & Flags.COMPRESSED:
                return m.body_view()
        return None

    def close(self) -> None:
        """Close every thread's sockets (before the context is terminated; callers are done by then)."""
        with self._lock:
            self.closed = True
            socks, self._open = self._open, []
        for s in socks:
            try:
                s.close(0) if isinstance(s, zmq.Socket) else s.close()
            except zmq.ZMQError:
                pass
