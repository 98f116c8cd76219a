"""The direct path: a small synchronous push_pull sent and answered on the caller's own thread.

Why: through the engine, one push_pull of one float crosses six thread hand-offs (caller -> I/O
thread -> libzmq -> ... -> libzmq -> I/O thread -> caller), each a wake-up, and waits for a Python
pass of the I/O loop at each end. A metric average or a model with hundreds of tiny tensors pays
that per call (2.7x gloo's all_reduce of one float). A caller that blocks anyway can do the
exchange itself: its own DEALER socket per server (ZeroMQ sockets belong to one thread, so one per
thread, each with an identity of its own), one PUSH that carries the pull, one blocking receive.
The server answers whichever identity pushed, so it needs nothing new.

Used only where it cannot change the outcome: the tensor is declared and ready, has one
partition, no compression, no tracing, nothing else of it is in flight. Everything else goes
through the engine, which keeps ordering, credit and priorities for the bulk of a step.
"""
from __future__ import annotations

import itertools
import threading
import time

import zmq
import zmq.backend

from pushpull.cluster.nodes import worker_identity
from pushpull.transport.van import tcp_host
from pushpull.transport.protocol import (
    Flags, Header, MsgType, ProtocolError, decode, decode_json, unpack_batch,
)

_recv = zmq.backend.Socket.recv
_send = zmq.backend.Socket.send
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
LIVENESS_S = 0.25  # how often a blocked call checks whether the cluster is still alive


class DirectPath:
    """Per-thread sockets to the servers, for :meth:`pushpull.worker.engine.Engine.push_pull_now`."""

    _thread_ids = itertools.count()

    def __init__(self, ctx: zmq.Context, rank: int, servers: dict[str, str], auth=None):
        self.ctx = ctx
        self.auth = auth  # the job's credentials, as on the engine's own sockets
        self.rank = rank
        self.servers = servers  # van socket name ("s0") -> tcp address
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[zmq.Socket] = []
        self.closed = False

    def _socket(self, sock: str) -> zmq.Socket:
        socks = getattr(self._local, "socks", None)
        if socks is None:
            socks = self._local.socks = {}
            self._local.tid = next(self._thread_ids)
        s = socks.get(sock)
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, int(LIVENESS_S * 1000))
            s.setsockopt(zmq.IDENTITY, worker_identity(self.rank, f"d{self._local.tid}"))
            if self.auth is not None:
                self.auth.connect(s, tcp_host(self.servers[sock]))
            s.connect(self.servers[sock])
            with self._lock:
                if self.closed:
                    s.close(0)
                    raise zmq.ZMQError(zmq.ETERM)
                self._open.append(s)
            socks[sock] = s
        return s

    def exchange(self, sock: str, header: Header, payload, timeout: float, alive,
                 want: MsgType = MsgType.PULL_RESP) -> memoryview:
        """Send ``header`` + ``payload`` (None: no body) to server ``sock`` and return the body of its
        ``want`` answer for the same key and round. Raises TimeoutError after ``timeout`` s, RuntimeError with
        the server's text on an ERROR, and ``alive()``'s reason (checked every LIVENESS_S) as ConnectionError."""
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
                reason = alive()
                if reason:
                    raise ConnectionError(reason) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer from server {sock[1:]} within {timeout:g}s") from None
                continue
            while frames[-1].more:
                frames.append(_recv(s, _NOBLOCK, copy=False))
            try:
                msg = decode(frames)
                msgs = unpack_batch(msg) if msg.header.type is MsgType.BATCH else (msg,)
            except ProtocolError:
                continue
            for m in msgs:
                h = m.header
                if h.key != header.key:
                    continue  # a late answer to an earlier call that timed out
                if h.type == MsgType.ERROR:
                    raise RuntimeError(decode_json(m.body()).get("error", "unknown server error"))
                if h.gen != header.gen:
                    continue  # an answer from before the workers changed
                if h.type == want and h.round == header.round and not h.flags & Flags.COMPRESSED:
                    return m.body_view()

    def close(self) -> None:
        """Close every thread's sockets (before the context is terminated; callers are done by then)."""
        with self._lock:
            self.closed = True
            socks, self._open = self._open, []
        for s in socks:
            try:
                s.close(0)
            except zmq.ZMQError:
                pass
