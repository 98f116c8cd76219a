"""One I/O thread per process that owns every ZeroMQ socket (ps-lite's Van).

ZeroMQ sockets must not be shared between threads, so all sends and receives
happen on this thread. Other threads hand over work with :meth:`Van.send` or
:meth:`Van.call_soon`, which queue it and wake the loop through an inproc
socket. Handlers run on the I/O thread; an exception in a handler is logged and
never stops the loop (a malformed message cannot crash a server).

Small messages (body up to ``batch_bytes``) for the same peer are held until the
end of the loop's current pass and then sent as one BATCH message: a step's
hundred-odd tiny gradients (biases, norms) otherwise cost a zmq message, a
wake-up and a Python dispatch each at both ends, which on a CPU-bound host
costs more than their bytes. Order per peer is kept: a large message first
sends what is held for its peer.

A ROUTER can have a direct lane beside it (:meth:`Van.bind_lane`,
:mod:`pushpull.transport.lane`): plain sockets polled in the same loop, whose
messages reach the ROUTER's handler and whose identities' answers go back on
them (at once, never held for a batch). While only lanes are busy, the loop
waits with one poll() instead of zmq_poll (:meth:`Van._quiet_wait`).
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import select
import sys
import threading
import time
from typing import Callable

import zmq
import zmq.backend
from zmq.utils.monitor import recv_monitor_message

from pushpull.transport.lane import ERROR, READ, WRITE, LaneError, LaneServer
from pushpull.transport.ratelimit import RateLimitedLog
from pushpull.transport.protocol import (
    BATCHED_OVERHEAD, Header, Msg, MsgType, ProtocolError, decode, pack_batch, unpack_batch,
)

log = logging.getLogger(__name__)


class BesideLane(bytes):
    """A ROUTER peer's identity for a message that goes over the ROUTER's own connection even where the
    peer has a data lane (:meth:`Van.bind_lane`): a PUSH_ACK returns the worker's credit, and on the lane
    it would wait behind the pull answers already queued for that worker, megabytes at 1 Gbit/s, which
    stalled each worker's window (docs/results/line_rate.md, "Why the PS lost at 1 Gbit/s"). Only for
    identities with a ZeroMQ connection of their own: a direct call's lane (``w<rank>.l<thread>``) has none."""
    __slots__ = ()

# pyzmq's constants are enum flags: plain ints keep the per-message checks int operations
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_BATCH = MsgType.BATCH
# pyzmq's Socket.send/recv_multipart wrap the Cython methods with type checks, enum flag arithmetic and
# a getsockopt(RCVMORE) per frame: about 3 us per message at each end, paid hundreds of times a step
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
# pyzmq's getsockopt wraps ZMQ_EVENTS in a PollEvent enum (an enum call per check)
_getsockopt = zmq.backend.Socket.get
BATCH_LIMIT = 1 << 20  # bytes held for one peer before they go out without waiting for the pass to end
QUIET_WAIT_MS = 100  # the longest wait that skips zmq_poll (see Van._quiet_wait) before one is made anyway

def tcp_host(addr: str) -> str:
    """The host of a ``tcp://host:port`` address."""
    return addr.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


RouterHandler = Callable[[bytes, Msg], None]
DealerHandler = Callable[[Msg], None]


class Van:
    """Owns sockets; dispatches received messages to handlers on one thread."""

    _ids = itertools.count()

    def __init__(self, name: str, batch_bytes: int = 0, auth=None):
        """``auth``: a :class:`pushpull.transport.security.JobAuth` that every socket of this van uses
        (None: no authentication, PUSHPULL_AUTH=none)."""
        self.name = name
        self.auth = auth
        self.peer_log = RateLimitedLog(log)  # what peers can make us log, one line per peer and kind
        self.batch_bytes = batch_bytes
        # (socket id, identity) -> [bytes held, [parts, ...]]; touched on the I/O thread only
        self._batches: dict[tuple, list] = {}
        self._deferred: list[Callable[[], None]] = []  # run once the current pass is done
        self.batches_sent = 0  # BATCH messages sent (messages batched: batched_messages)
        self.batched_messages = 0
        self.ctx = zmq.Context(io_threads=1)
        self._sockets: dict[str, zmq.Socket] = {}
        self._handlers: dict[zmq.Socket, tuple[str, Callable, bool]] = {}
        self._monitors: dict[zmq.Socket, Callable[[int, str], None]] = {}  # monitor socket -> handler
        self._poller = zmq.Poller()
        self._lanes: dict[str, LaneServer] = {}  # ROUTER name -> its direct lane (pushpull.transport.lane)
        self._lane_fds: dict[int, object] = {}  # descriptor -> the lane it belongs to (its ready(fd, events))
        self._dealer_lanes: dict[str, _DealerLane] = {}  # DEALER name -> the lane that carries its messages
        # ZeroMQ socket operations on the I/O thread, and registration changes: see _quiet_wait
        self._zmq_ops = 0
        self._poll_version = 0
        self._quiet: tuple | None = None  # (version, select.poll, ZMQ_FDs in it)
        self._outbox: collections.deque = collections.deque()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        wake_addr = f"inproc://van-wake-{id(self)}-{next(self._ids)}"
        self._wake_rx = self.ctx.socket(zmq.PULL)
        self._wake_rx.bind(wake_addr)
        self._wake_tx = self.ctx.socket(zmq.PUSH)
        self._wake_tx.connect(wake_addr)
        self._poller.register(self._wake_rx, zmq.POLLIN)
        self._timers: list[tuple[float, int, float, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._thread_id: int | None = None  # its get_ident(): cheaper to compare than current_thread()
        self._running = False
        self._stopped = threading.Event()

    # ------------------------------------------------------------ sockets --
    def _tune(self, s: zmq.Socket) -> None:
        # no silent drops or blocking at a high-water mark: the credit window
        # bounds what is in flight, not ZeroMQ's queues
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.TCP_KEEPALIVE, 1)

    def bind_router(self, sid: str, host: str, port: int, handler: RouterHandler, advertised: str | None = None,
                    max_message_bytes: int = 0) -> int:
        """Bind a ROUTER socket on ``host:port`` (port 0 = any free port), reached by peers at ``advertised``
        (default ``host``); returns the port. A peer that sends a message larger than ``max_message_bytes``
        (0 = no limit) is disconnected by libzmq before the message is buffered."""
        s = self.ctx.socket(zmq.ROUTER)
        self._tune(s)
        if max_message_bytes:
            s.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if self.auth is not None:
            # the mechanism follows the address peers connect to, so both ends pick the same one
            self.auth.listen(s, advertised or host)
        bind_host = "*" if host in ("0.0.0.0", "*") else host
        if port == 0:
            port = s.bind_to_random_port(f"tcp://{bind_host}", min_port=20000, max_port=60000, max_tries=200)
        else:
            s.bind(f"tcp://{bind_host}:{port}")
        self._add(sid, s, handler, router=True)
        return port

    def bind_ipc(self, sid: str) -> str | None:
        """Also listen with ROUTER ``sid`` (bound first) on an abstract Unix socket; returns its
        ``ipc://@NAME`` address, or None where the system has no abstract sockets (not Linux).

        Why: over loopback TCP, each byte of a push or a pull goes through the TCP stack (segments,
        acknowledgements, a softirq per batch of them) besides the two copies any socket makes; a Unix socket
        makes the same two copies and nothing else (raw pyzmq bounce of 400 MB in 4 MiB messages on the 2-core
        VM: 3.4-4.0 GB/s over TCP, 3.9-4.8 GB/s over ipc). Who can connect is what loopback allows: an
        abstract socket belongs to the network namespace, as 127.0.0.1 does, and the socket's authentication
        (set up before its first bind) applies to connections on every endpoint. The name is random, so
        another job's server on the host never takes it. Must be called before :meth:`start`."""
        if not sys.platform.startswith("linux"):
            return None
        addr = f"ipc://@pushpull-{self.name}-{os.getpid()}-{os.urandom(8).hex()}"
        try:
            self._sockets[sid].bind(addr)
        except zmq.ZMQError as e:  # a libzmq built without ipc: the workers keep the TCP port
            log.warning("%s: no local socket (%s); workers on this host use loopback TCP", self.name, e)
            return None
        return addr

    def connect_dealer(self, sid: str, addr: str, identity: bytes, handler: DealerHandler,
                       host: str | None = None) -> None:
        """Connect a DEALER to ``addr``; ``host`` (default: ``addr``'s) picks the authentication mechanism,
        so an ipc address gets the one its server's advertised host calls for."""
        s = self.ctx.socket(zmq.DEALER)
        self._tune(s)
        s.setsockopt(zmq.IDENTITY, identity)
        if self.auth is not None:
            self.auth.connect(s, host or tcp_host(addr))
        s.connect(addr)
        self._add(sid, s, handler, router=False)

    def replace_dealer(self, sid: str, addr: str, identity: bytes, handler: DealerHandler,
                       host: str | None = None) -> None:
        """Point DEALER ``sid`` at ``addr`` from now on (a lost server's replacement took its place): the old
        socket, the lane that carried it and the messages batched for it are dropped (they were for the lost
        peer, of an older generation), and a new DEALER connects. Thread-safe."""
        def swap() -> None:
            lane = self._dealer_lanes.get(sid)
            if lane is not None:
                lane.close()
            old = self._sockets.pop(sid, None)
            if old is not None:
                self._handlers.pop(old, None)
                try:
                    self._poller.unregister(old)
                except KeyError:
                    pass
                old.close(linger=0)
                self._poll_version += 1
            for dest in [d for d in self._batches if d[0] == sid]:
                del self._batches[dest]
            self.connect_dealer(sid, addr, identity, handler, host)

        if self._thread is None or threading.current_thread() is self._thread:
            swap()
        else:
            self.call_soon(swap)

    def bind_lane(self, sid: str, host: str, key: bytes, max_message_bytes: int = 0, local: bool = False,
                  advertised: str | None = None, sealed: bool = False) -> str:
        """Beside ROUTER ``sid`` (bound first), listen on ``host`` (or, ``local``, on an abstract Unix socket) for
        direct lanes (plain sockets from a worker's calling thread, :mod:`pushpull.transport.lane`); returns
        the lane's address. Their messages go to ``sid``'s handler with the lane's proven identity, and a
        send to that identity on ``sid`` takes the lane. ``sealed``: its connections are encrypted
        (pushpull.transport.seal). Must be called before :meth:`start`."""
        _, handler, _ = self._handlers[self._sockets[sid]]

        def deliver(identity: bytes, frames: list) -> None:
            self._dispatch(sid, identity, frames, handler, True)

        lane = LaneServer(host, key, max_message_bytes, lambda fd, ev: self._watch(lane, fd, ev), deliver,
                          self.peer_log, local=local, advertised=advertised, sealed=sealed)
        lane.start()
        self._lanes[sid] = lane
        self.call_later(1.0, lane.check_hellos, every=1.0)
        return lane.address

    def _watch(self, owner, fd: int, events: int) -> None:
        """(Re)register plain descriptor ``fd`` of ``owner`` (a lane, whose ``ready(fd, events)`` the loop
        calls) for ``events``; 0 unregisters it. On the I/O thread, or before :meth:`start`."""
        fds = self._lane_fds
        if events:
            fds[fd] = owner
            self._poller.register(fd, events)  # registering again changes the events
        elif fd in fds:
            del fds[fd]
            self._poller.unregister(fd)
        self._poll_version += 1

    def adopt_lane(self, sid: str, conn) -> None:
        """Carry DEALER ``sid``'s messages, both ways, over ``conn`` (a proven lane to the same server,
        :meth:`pushpull.transport.lane.LaneClient.detach`) from now on; its answers go to ``sid``'s handler.
        Should the lane break, ``sid`` falls back to the DEALER (what was in flight on the lane is lost; the
        callers' deadlines and the membership report it). Thread-safe."""
        def register() -> None:
            _, handler, _ = self._handlers[self._sockets[sid]]
            lane = _DealerLane(self, sid, conn, handler)
            self._dealer_lanes[sid] = lane
            self._watch(lane, conn.fd, READ)

        if self._thread is None or threading.current_thread() is self._thread:
            register()
        else:
            self.call_soon(register)

    def monitor(self, sid: str, events: int, on_event: Callable[[int, str], None]) -> None:
        """Call ``on_event(event, endpoint)`` on the I/O thread when libzmq reports one of ``events``
        (``zmq.EVENT_*`` flags) on socket ``sid``: a closed connection is known at once, where heartbeats
        take their timeout."""
        def register() -> None:
            m = self._sockets[sid].get_monitor_socket(events)
            self._monitors[m] = on_event
            self._poller.register(m, zmq.POLLIN)
            self._poll_version += 1
            self._zmq_ops += 1

        if self._thread is None or threading.current_thread() is self._thread:
            register()
        else:
            self.call_soon(register)

    def _drain_monitor(self, m: zmq.Socket, on_event: Callable[[int, str], None]) -> None:
        self._zmq_ops += 1
        while _getsockopt(m, _EVENTS) & _POLLIN:
            try:
                ev = recv_monitor_message(m, _NOBLOCK)
            except zmq.Again:
                return
            try:
                on_event(int(ev["event"]), ev.get("endpoint", b"").decode(errors="replace"))
            except Exception:
                log.exception("%s: socket event handler failed", self.name)

    def reachable(self, sid: str, identity: bytes, header: Header) -> bool:
        """On the I/O thread: send ``header`` to ``identity`` on ROUTER ``sid`` now; False when the ROUTER has
        no connection for that identity any more (ROUTER_MANDATORY's EHOSTUNREACH): the peer is gone."""
        dest = (sid, identity)
        if dest in self._batches:
            self._flush(dest)
        s = self._sockets[sid]
        self._zmq_ops += 1
        try:
            _send(s, identity, _SNDMORE | _NOBLOCK, copy=True)
            _send(s, header.pack(), _NOBLOCK, copy=True)
        except zmq.ZMQError as e:
            return e.errno != zmq.EHOSTUNREACH
        return True

    def _add(self, sid: str, s: zmq.Socket, handler: Callable, router: bool) -> None:
        def register() -> None:
            self._sockets[sid] = s
            self._handlers[s] = (sid, handler, router)
            self._poller.register(s, zmq.POLLIN)
            self._poll_version += 1
            self._zmq_ops += 1

        if self._thread is None or threading.current_thread() is self._thread:
            register()
        else:
            self.call_soon(register)

    # ------------------------------------------------------------ sending --
    def send(self, sid: str, header: Header, frames: list = (), identity: bytes | None = None) -> None:
        """Send ``header`` + ``frames`` on socket ``sid`` (thread-safe; large frames zero-copy,
        small ones copied into their peer's batch at the end of the pass).

        Frames must stay unchanged until delivered; pyzmq keeps them alive.
        """
        parts = [header.pack(), *frames]
        if threading.get_ident() == self._thread_id:
            self._post(sid, identity, parts)
        else:
            self._outbox.append((sid, identity, parts))
            self._wake()

    @staticmethod
    def shared_frame(buf) -> zmq.Frame:
        """A frame to send several times (one sum to every worker): libzmq shares its data by
        reference count, so it is wrapped, and tracked for release, once instead of per send.
        Small buffers are copied once, as pyzmq would copy them on every send anyway."""
        return zmq.Frame(buf, copy=memoryview(buf).nbytes < zmq.COPY_THRESHOLD)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread (thread-safe)."""
        self._outbox.append((None, None, fn))
        self._wake()

    def at_pass_end(self, fn: Callable[[], None]) -> None:
        """On the I/O thread: run ``fn`` once the current pass of the loop has handled everything
        that arrived. Waking another thread (a waiter, an engine) in the middle of a pass makes it
        queue for the GIL this thread holds; at the end of the pass this thread is about to poll,
        so the woken thread runs at once, and a pass's many completions cost one wake-up."""
        self._deferred.append(fn)

    def _run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for fn in deferred:
            try:
                fn()
            except Exception:
                log.exception("%s: end-of-pass callback failed", self.name)

    def call_later(self, delay: float, fn: Callable[[], None], every: float = 0.0) -> None:
        """Run ``fn`` on the I/O thread after ``delay`` s, then every ``every`` s if > 0.

        Must be called before :meth:`start` or from the I/O thread."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), every, fn))

    def _wake(self) -> None:
        # one wake-up message per batch of queued work (see the loop for why none is lost)
        if self._wake_pending:
            return
        with self._wake_lock:
            self._wake_pending = True
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # shutting down

    def _post(self, sid: str, identity: bytes | None, parts: list) -> None:
        """On the I/O thread: hold a small message for its peer's batch, or send now. An identity with a
        direct lane is written at once: a lane carries one blocking call at a time, so nothing would
        join its batch, and its caller is waiting."""
        if identity is not None and self._lanes and b"." in identity:  # a direct call's lane (w<rank>.l<thread>)
            lane = self._lanes.get(sid)
            if lane is not None and lane.send(identity, parts):
                return
        if identity.__class__ is BesideLane:
            lane = self._lanes.get(sid) if self._lanes else None
            if lane is not None and identity in lane.by_identity:  # not in a batch, which may leave on the lane
                self._send_now(sid, identity, parts)
                return
            identity = bytes(identity)  # no lane: batched as any small message to that peer
        dest = (sid, identity)
        if self.batch_bytes and len(parts) <= 2:
            size = memoryview(parts[1]).nbytes if len(parts) == 2 else 0
            if size <= self.batch_bytes:
                held = self._batches.get(dest)
                if held is None:
                    self._batches[dest] = held = [0, []]
                held[0] += size + BATCHED_OVERHEAD
                held[1].append(parts)
                if held[0] >= BATCH_LIMIT:
                    self._flush(dest)
                return
        if dest in self._batches:
            self._flush(dest)
        self._send_now(sid, identity, parts)

    def _flush(self, dest: tuple) -> None:
        _, messages = self._batches.pop(dest)
        if len(messages) == 1:
            self._send_now(dest[0], dest[1], messages[0])
            return
        self.batches_sent += 1
        self.batched_messages += len(messages)
        self._send_now(dest[0], dest[1], pack_batch(messages))

    def _flush_all(self) -> None:
        for dest in list(self._batches):
            self._flush(dest)

    def _send_now(self, sid: str, identity: bytes | None, parts: list) -> None:
        s = self._sockets.get(sid)
        if s is None:
            log.error("%s: send on unknown socket %r dropped", self.name, sid)
            return
        if identity is not None:
            if identity.__class__ is BesideLane:
                identity = bytes(identity)
            else:
                lane = self._lanes.get(sid) if self._lanes else None
                if lane is not None and lane.send(identity, parts):
                    return
            parts = [identity, *parts]
        elif self._dealer_lanes:
            lane = self._dealer_lanes.get(sid)
            if lane is not None:
                lane.send(parts)
                return
        self._zmq_ops += 1
        try:
            last = len(parts) - 1
            # never blocking: a DEALER whose only peer is gone (or refused its handshake) would block
            # the I/O thread for good; the message is dropped and the caller's deadline reports it
            for i, frame in enumerate(parts):
                _send(s, frame, (_SNDMORE if i < last else 0) | _NOBLOCK, copy=False)
        except zmq.Again:
            log.warning("%s: %s has no connected peer (gone, or refused our authentication); message dropped",
                        self.name, sid)
        except zmq.ZMQError as e:
            # ROUTER_MANDATORY: peer unknown (not connected yet or gone)
            log.warning("%s: send on %s failed: %s", self.name, sid, e)

    # ------------------------------------------------------------ the loop --
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=f"van-{self.name}", daemon=True)
        self._thread.start()

    def run_forever(self) -> None:
        """Run the loop on the calling thread (servers and the scheduler do this)."""
        self._running = True
        self._thread = threading.current_thread()
        self._loop()

    def stop(self, join: bool = True) -> None:
        self._running = False
        self._wake()
        if join and self._thread is not None and threading.current_thread() is not self._thread:
            self._stopped.wait(10)

    @property
    def running(self) -> bool:
        return self._running

    def _quiet_wait(self, timeout_ms: int) -> dict | None:
        """Wait for the lanes (plain descriptors) without zmq_poll, or None if a ZeroMQ socket may have news.

        Why: zmq_poll asks every ZeroMQ socket for ZMQ_EVENTS before and after it waits, a poll() and a
        getpid() each inside libzmq: 16 system calls per direct-lane round on a server, where the round's
        own work is 4. Only valid while no ZeroMQ socket was touched since a zmq_poll: each socket's
        ZMQ_FD then signals when anything arrives for it (libzmq re-arms it as it finds a pipe empty; any
        send or receive may consume a signal, which is why ``_zmq_ops`` counts them). Each ZMQ_FD is
        watched here too, and its signal sends the loop back to zmq_poll."""
        if self._quiet is None or self._quiet[0] != self._poll_version:
            p, zfds = select.poll(), set()
            for sock, flags in self._poller.sockets:
                if isinstance(sock, int):
                    p.register(sock, (select.POLLIN if flags & _POLLIN else 0)
                               | (select.POLLOUT if flags & int(zmq.POLLOUT) else 0))
                else:
                    fd = sock.getsockopt(zmq.FD)
                    p.register(fd, select.POLLIN)
                    zfds.add(fd)
            self._quiet = (self._poll_version, p, zfds)
        _, p, zfds = self._quiet
        events = {}
        for fd, ev in p.poll(timeout_ms):
            if fd in zfds:
                return None
            events[fd] = ((_POLLIN if ev & select.POLLIN else 0) | (int(zmq.POLLOUT) if ev & select.POLLOUT else 0)
                          | (int(zmq.POLLERR) if ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) else 0))
        return events

    def _loop(self) -> None:
        self._thread_id = threading.get_ident()
        quiet_at = -1  # _zmq_ops as of the last zmq_poll (-1: make the next wait a zmq_poll)
        try:
            while self._running:
                timeout_ms = 1000
                if self._timers:
                    timeout_ms = max(0, min(timeout_ms, int((self._timers[0][0] - time.monotonic()) * 1000) + 1))
                if self._outbox or self._batches or self._deferred:  # work queued by the last pass
                    timeout_ms = 0
                events = None
                if quiet_at == self._zmq_ops and timeout_ms > 0 and self._lane_fds:
                    events = self._quiet_wait(min(timeout_ms, QUIET_WAIT_MS))
                    if not events:  # timed out (or a ZeroMQ socket signalled): zmq_poll next
                        quiet_at = -1
                if events is None:
                    events = dict(self._poller.poll(timeout_ms))
                    quiet_at = self._zmq_ops
                if self._wake_rx in events:
                    self._zmq_ops += 1
                    while _getsockopt(self._wake_rx, _EVENTS) & _POLLIN:
                        self._wake_rx.recv(_NOBLOCK)
                    # cleared after the wake-ups are consumed, before the outbox is drained: a set
                    # flag always has a wake-up message behind it, so no item can wait for the timeout
                    self._wake_pending = False
                self._drain_outbox()
                for s, (sid, handler, router) in list(self._handlers.items()):
                    if s in events:
                        self._drain_socket(s, sid, handler, router)
                for m, on_event in list(self._monitors.items()):
                    if m in events:
                        self._drain_monitor(m, on_event)
                if self._lane_fds:
                    for fd, ev in events.items():
                        lane = self._lane_fds.get(fd) if fd.__class__ is int else None
                        if lane is not None:
                            lane.ready(fd, ev)
                self._run_timers()
                # deferred work first: what it sends joins this pass's batches instead of waiting
                if self._deferred:
                    self._run_deferred()
                if self._batches:
                    self._flush_all()
        finally:
            self._run_deferred()
            self._flush_all()
            self._close()
            self._stopped.set()

    def _drain_outbox(self) -> None:
        for _ in range(len(self._outbox)):
            sid, identity, item = self._outbox.popleft()
            if sid is None:
                try:
                    item()
                except Exception:
                    log.exception("%s: callback failed", self.name)
            else:
                self._post(sid, identity, item)

    def _drain_socket(self, s: zmq.Socket, sid: str, handler: Callable, router: bool) -> None:
        # ZMQ_EVENTS says whether a message is waiting: cheaper than ending every drain on a raised
        # zmq.Again (an exception object per poll); bounded so one busy peer cannot starve the others
        self._zmq_ops += 1
        for _ in range(256):
            if not _getsockopt(s, _EVENTS) & _POLLIN:
                return
            try:
                frames = [_recv(s, _NOBLOCK, copy=False)]
                while frames[-1].more:  # the rest of a multipart message is already there
                    frames.append(_recv(s, _NOBLOCK, copy=False))
            except zmq.Again:  # not expected after POLLIN, but never worth the loop
                return
            identity = None
            if router:
                if len(frames) < 2:
                    self.peer_log.warning((sid, "no identity"), "%s: dropped a message with no identity on %s",
                                          self.name, sid)
                    continue
                identity, frames = frames[0].bytes, frames[1:]
            self._dispatch(sid, identity, frames, handler, router)

    def _dispatch(self, sid: str, identity: bytes | None, frames: list, handler: Callable, router: bool) -> None:
        """Decode one received message (a BATCH into its messages) and run the socket's handler on each."""
        try:
            msg = decode(frames)
            msgs = unpack_batch(msg) if msg.header.type is _BATCH else (msg,)
        except ProtocolError as e:
            self.peer_log.warning((sid, identity, "malformed"), "%s: dropped malformed message on %s from %r: %s",
                                  self.name, sid, identity, e)
            return
        for msg in msgs:
            try:
                if router:
                    handler(identity, msg)
                else:
                    handler(msg)
            except Exception:
                log.exception("%s: handler for %s failed on %s", self.name, msg.header.type.name, sid)

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, every, fn = heapq.heappop(self._timers)
            try:
                fn()
            except Exception:
                log.exception("%s: timer failed", self.name)
            if every > 0 and self._running:
                heapq.heappush(self._timers, (now + every, next(self._timer_seq), every, fn))

    def _close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        for lane in list(self._dealer_lanes.values()):
            lane.close()
        for s in list(self._sockets.values()):
            if self._monitors:
                try:
                    s.disable_monitor()
                except zmq.ZMQError:
                    pass
        for m in list(self._monitors):
            m.close(0)
        for s in list(self._sockets.values()):
            try:
                s.close(linger=500)
            except zmq.ZMQError:
                pass
        self._wake_rx.close(0)
        with self._wake_lock:
            self._wake_tx.close(0)
        if self.auth is not None:
            self.auth.close(self.ctx)
        self.ctx.term()


class _DealerLane:
    """A worker's lane to one server, in place of its DEALER: driven by the Van's loop like a server's lanes."""

    def __init__(self, van: Van, sid: str, conn, handler: Callable) -> None:
        self.van, self.sid, self.conn, self.handler = van, sid, conn, handler
        self.chunk_view = memoryview(bytearray(1 << 18))

    def send(self, parts) -> None:
        c = self.conn
        waiting = c.waiting
        try:
            more = c.write(parts)
        except OSError as e:
            self.fail(f"write failed: {e}")
            return
        if more and not waiting:
            self.van._watch(self, c.fd, READ | WRITE)

    def ready(self, fd: int, events: int) -> None:
        c = self.conn
        if events & WRITE and c.waiting:
            try:
                more = c.flush()
            except OSError as e:
                self.fail(f"write failed: {e}")
                return
            if not more:
                self.van._watch(self, c.fd, READ)
        if not events & (READ | ERROR):
            return
        for _ in range(64):  # bounded: one busy lane cannot starve the others
            try:
                msgs = c.read(self.chunk_view)
            except (BlockingIOError, InterruptedError):
                return
            except (OSError, LaneError) as e:  # pushpull.transport.seal.SealError is an OSError
                self.fail(str(e))
                return
            if msgs is None:  # the server closed it (it is leaving; a server that fails is reported by the
                self.fail(None)  # membership): quietly back to the DEALER
                return
            for frames in msgs:
                self.van._dispatch(self.sid, None, frames, self.handler, False)
            if self.van._dealer_lanes.get(self.sid) is not self or c.reader.body is None:
                return  # (go on only while a large message fills up)

    def fail(self, why: str | None) -> None:
        if why:
            log.warning("%s: the lane to %s broke (%s); its messages go over ZeroMQ from now on", self.van.name,
                        self.sid, why)
        else:
            log.info("%s: the server closed the lane to %s; its messages go over ZeroMQ from now on", self.van.name,
                     self.sid)
        self.close()

    def close(self) -> None:
        if self.van._dealer_lanes.get(self.sid) is self:
            del self.van._dealer_lanes[self.sid]
        self.van._watch(self, self.conn.fd, 0)
        try:
            self.conn.sock.close()
        except OSError:
            pass
