"""The client side of membership, shared by servers and workers.

Registers with the scheduler, receives the address book, sends heartbeats and
notices when the scheduler itself goes silent, runs barriers, and surfaces
NODE_FAILED / TERMINATE / ERROR messages to its owner through callbacks. Every
wait has a deadline and fails with a message saying what was missing.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Callable

import zmq

from pushpull.config import Config
from pushpull.transport.protocol import Header, Msg, MsgType, decode_json, encode_json
from pushpull.transport.van import Van

log = logging.getLogger(__name__)

SCHED = "scheduler"
LOST_GRACE_S = 1.0  # a closed connection to the scheduler that is not back within this is a dead scheduler


def print_culprit(pid: int, reason: str) -> None:
    """One line on stderr naming the process a failure comes from, for the launcher to blame it (first
    to exit is often a healthy node that learnt of another's death)."""
    print(f"pushpull-culprit pid={pid}: {reason}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """The cluster cannot go on: a node died, the scheduler is gone, a wait timed out."""


class Member:
    """A node's link to the scheduler. Lives on its owner's :class:`Van`."""

    def __init__(self, van: Van, cfg: Config, info: dict,
                 on_message: Callable[[Msg], None] | None = None,
                 on_registered: Callable[[dict], None] | None = None):
        """``on_registered(book)`` runs on the I/O thread as the address book arrives, before
        any other message is handled there: state that peers' first messages depend on
        (the number of workers, say) must be set in it, not after :meth:`register` returns."""
        self.van = van
        self.cfg = cfg
        self.info = dict(info, pid=os.getpid(), hostname=socket.gethostname())
        self.on_message = on_message
        self.on_registered = on_registered
        self.book: dict | None = None
        self.node_id: int | None = None
        self.failure: str | None = None
        self.terminated = threading.Event()
        self._registered = threading.Event()
        self._barriers: dict[int, tuple[threading.Event, str]] = {}  # seq -> (its release, its group)
        self._barrier_seq = 0
        self._last_heard = time.monotonic()
        self._lock = threading.Lock()
        self._failure_callbacks: list[Callable[[str], None]] = []
        # a lost scheduler (PUSHPULL_SCHEDULER_RECOVERY > 0): this node keeps working and registers again with the
        # new one, telling it what the owner's ``recover_state()`` says (its generation, its tensors' places, ...);
        # the owner's ``on_recovered`` callbacks then send again what the lost scheduler never answered
        self.recover_state: Callable[[], dict] | None = None
        self._recovered_callbacks: list[Callable[[], None]] = []
        self._finishing = False
        self.recoveries = 0  # schedulers this node has re-registered with
        identity = f"{info['role']}-{os.getpid()}-{id(self)}".encode()
        addr = f"tcp://{cfg.root_uri}:{cfg.root_port}"
        van.connect_dealer(SCHED, addr, identity, self._handle)
        van.call_later(0.0, self._heartbeat, every=cfg.heartbeat_interval)
        self._lost_since: float | None = None  # when the connection to the scheduler closed, if it did
        self._silent_lost = False  # _lost_since was set by silence, not a closed connection (it may answer again)
        self._unanswered = 0  # heartbeats sent since the scheduler last said anything
        van.monitor(SCHED, zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                    self._on_scheduler_event)

    # ------------------------------------------------------------ requests --
    def register(self) -> dict:
        """Register and block until the scheduler sends the address book."""
        self.van.send(SCHED, Header(MsgType.REGISTER), [encode_json(self.info)])
        t0 = time.monotonic()
        # the scheduler ends a registration that cannot complete itself, naming who is missing; a node that
        # never hears from it gives up a little later
        deadline = t0 + self.cfg.register_timeout + 3.0
        next_note = t0 + 5.0
        while not self._registered.wait(0.1):
            self.raise_if_failed()
            now = time.monotonic()
            if now > deadline:
                raise ClusterError(
                    f"registration timed out: no answer from the scheduler at {self.cfg.root_uri}:"
                    f"{self.cfg.root_port} within {now - t0:.0f}s (PUSHPULL_REGISTER_TIMEOUT="
                    f"{self.cfg.register_timeout:g}): is it running there (DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT)?")
            if now > next_note and self._last_heard < t0:
                next_note += 5.0
                log.warning("no answer from the scheduler at %s:%d yet (%.0fs)", self.cfg.root_uri,
                            self.cfg.root_port, now - t0)
        self.raise_if_failed()
        assert self.book is not None
        return self.book

    def barrier(self, group: str = "worker") -> None:
        """Wait until every node of ``group`` ('worker' or 'all') reached this barrier."""
        with self._lock:
            self._barrier_seq += 1
            seq = self._barrier_seq
            ev = threading.Event()
            self._barriers[seq] = (ev, group)
        self._send_barrier(seq, group)
        deadline = time.monotonic() + self.cfg.timeout
        while not ev.wait(0.1):
            self.raise_if_failed()
            if time.monotonic() > deadline:
                raise ClusterError(f"barrier {seq} ({group}) not released within {self.cfg.timeout:.0f}s")

    def _send_barrier(self, seq: int, group: str) -> None:
        self.van.send(SCHED, Header(MsgType.BARRIER, sender=self.node_id or 0, key=seq), [encode_json({"group": group})])

    def send(self, header: Header, frames: list = ()) -> None:
        header.sender = self.node_id if self.node_id is not None else -2
        self.van.send(SCHED, header, frames)

    def finish(self, timeout: float | None = None) -> None:
        """Tell the scheduler this worker is done and wait until every worker is."""
        self._finishing = True
        self.van.send(SCHED, Header(MsgType.FINISH, sender=self.node_id or 0))
        if not self.terminated.wait(timeout or self.cfg.timeout):
            log.warning("scheduler did not confirm shutdown within the timeout; leaving anyway")

    def on_failure(self, fn: Callable[[str], None]) -> None:
        self._failure_callbacks.append(fn)

    def on_recovered(self, fn: Callable[[], None]) -> None:
        """``fn()`` runs on the I/O thread once a new scheduler took this node back (send again what the
        lost one never answered)."""
        self._recovered_callbacks.append(fn)

    @property
    def scheduler_lost(self) -> bool:
        """The scheduler's connection is down and a new one is awaited (PUSHPULL_SCHEDULER_RECOVERY)."""
        return self._lost_since is not None and self.cfg.scheduler_recovery > 0

    def raise_if_failed(self) -> None:
        if self.failure:
            raise ClusterError(self.failure)

    def fail(self, reason: str) -> None:
        if self.failure:
            return
        self.failure = reason
        log.error("%s", reason)
        for fn in self._failure_callbacks:
            try:
                fn(reason)
            except Exception:
                log.exception("failure callback failed")

    # ------------------------------------------------------------ I/O thread --
    def _on_scheduler_event(self, event: int, endpoint: str) -> None:
        """The scheduler's connection closed, or our credentials were refused: fail in about a second
        (a reconnect within it cancels), instead of after PUSHPULL_HEARTBEAT_TIMEOUT."""
        where = f"{self.cfg.root_uri}:{self.cfg.root_port}"
        recovery = self.cfg.scheduler_recovery if self._registered.is_set() and not self.failure else 0.0
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self._lost_since is not None and recovery:
                self._register_again()  # a scheduler at the address again: a new one (or the old one back)
            else:
                self._lost_since = None
        elif event == zmq.EVENT_DISCONNECTED:
            self._silent_lost = False  # gone now, not only silent (a hung one the launcher killed, say)
            if not self.terminated.is_set() and self._lost_since is None:
                self._lost_since = time.monotonic()
                if recovery:
                    log.warning("the connection to the scheduler at %s closed; working on and waiting up to %.0fs "
                                "for a new one (PUSHPULL_SCHEDULER_RECOVERY)", where, recovery)
                self.van.call_later(recovery or LOST_GRACE_S, self._check_lost)
        elif not self._registered.is_set() or event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.fail(f"the scheduler at {where} refused this node's credentials: is PUSHPULL_SECRET the same "
                      f"as the scheduler's (and PUSHPULL_AUTH too)?")
            self._registered.set()

    def _check_lost(self) -> None:
        if self._lost_since is not None and not self.terminated.is_set():
            waited = time.monotonic() - self._lost_since
            if self.cfg.scheduler_recovery and waited < self.cfg.scheduler_recovery - 0.01:
                return  # a new scheduler took this node back and lost it again: that loss has its own check
            self.fail(f"the connection to the scheduler at {self.cfg.root_uri}:{self.cfg.root_port} closed "
                      f"{waited:.1f}s ago and did not come back"
                      + (f" (with a new scheduler that took this node back, within PUSHPULL_SCHEDULER_RECOVERY="
                         f"{self.cfg.scheduler_recovery:g}s)" if self.cfg.scheduler_recovery else "")
                      + ": it exited or was killed")

    def _register_again(self) -> None:
        """Tell the new scheduler who this node is and where the job stands for it (on the I/O thread)."""
        state = dict(self.info, recover=True, node_id=self.node_id, job_id=(self.book or {}).get("job_id"),
                     barrier_seq=self._barrier_seq, finished=self._finishing)
        if self.recover_state is not None:
            state.update(self.recover_state())
        log.warning("a scheduler answers at %s:%d again; registering with it (%.1fs after the loss)",
                    self.cfg.root_uri, self.cfg.root_port, time.monotonic() - (self._lost_since or 0.0))
        self.van.send(SCHED, Header(MsgType.REGISTER, sender=self.node_id if self.node_id is not None else -2),
                      [encode_json(state)])

    def _taken_back(self, book: dict) -> None:
        """The new scheduler took this node back: send again what the lost one never answered."""
        lost = time.monotonic() - (self._lost_since or time.monotonic())
        self._lost_since, self._silent_lost = None, False
        # the new scheduler's book: its pid (a hung one is named by it), the generation it took over in
        self.book = dict(self.book or {}, **{k: book[k] for k in ("scheduler_pid", "gen", "job_id") if k in book})
        self.recoveries += 1
        self._last_heard = time.monotonic()
        log.warning("the new scheduler took this node back (%.1fs after the loss; generation %s)", lost,
                    book.get("gen"))
        with self._lock:
            pending = sorted((seq, group) for seq, (_, group) in self._barriers.items())
        for seq, group in pending:
            self._send_barrier(seq, group)
        if self._finishing:
            self.van.send(SCHED, Header(MsgType.FINISH, sender=self.node_id or 0))
        for fn in self._recovered_callbacks:
            try:
                fn()
            except Exception:
                log.exception("recovery callback failed")

    def _heartbeat(self) -> None:
        if self.terminated.is_set():
            return
        if self.scheduler_lost and not self._silent_lost:
            return  # nothing to tell a scheduler that is not there; the recovery deadline watches instead
        if self._silent_lost:  # a silent one may only have been slow: it answers this, or a new one comes
            self.van.send(SCHED, Header(MsgType.HEARTBEAT, sender=self.node_id if self.node_id is not None else 0))
            return
        silent = time.monotonic() - self._last_heard
        # silence is the scheduler's only if this node asked: a node that was itself stalled sent nothing
        asked = self._unanswered >= 2
        if silent > self.cfg.heartbeat_timeout and asked and self._registered.is_set() \
                and self.cfg.scheduler_recovery and not self.failure:
            # hung (stopped, or its host unreachable): name it, so that a launcher that restarts schedulers
            # kills it and starts a new one; meanwhile work on, as for a closed connection
            pid = (self.book or {}).get("scheduler_pid")
            reason = (f"the scheduler has been silent for {silent:.0f}s (PUSHPULL_HEARTBEAT_TIMEOUT="
                      f"{self.cfg.heartbeat_timeout:g}): hung")
            if pid and self.cfg.root_uri in ("127.0.0.1", "localhost", socket.gethostname()):
                print_culprit(int(pid), reason)
            log.warning("%s; working on and waiting up to %.0fs for a new one (PUSHPULL_SCHEDULER_RECOVERY)", reason,
                        self.cfg.scheduler_recovery)
            self._lost_since = time.monotonic()
            self._silent_lost = True
            self.van.call_later(self.cfg.scheduler_recovery, self._check_lost)
            return
        if silent > self.cfg.heartbeat_timeout and asked and self._registered.is_set():
            self.fail(f"the scheduler at {self.cfg.root_uri}:{self.cfg.root_port} has been silent for "
                      f"{silent:.0f}s (PUSHPULL_HEARTBEAT_TIMEOUT={self.cfg.heartbeat_timeout:g}); it has died")
            return
        if self.node_id is not None:
            self._unanswered += 1
            self.van.send(SCHED, Header(MsgType.HEARTBEAT, sender=self.node_id))

    def _handle(self, msg: Msg) -> None:
        self._last_heard = time.monotonic()
        self._unanswered = 0
        t = msg.header.type
        if self._silent_lost and t != MsgType.REGISTER_ACK:
            # the scheduler found silent answers again (it was slow, not hung): nothing was lost
            log.warning("the scheduler answers again after %.1fs of silence", time.monotonic() - (self._lost_since or 0))
            self._lost_since, self._silent_lost = None, False
        if t == MsgType.REGISTER_ACK and self._registered.is_set():
            book = decode_json(msg.body())
            if book.get("recovered") and self._lost_since is not None:
                self._taken_back(book)
            else:
                log.info("an address book from the scheduler ignored (this node is registered and not lost)")
        elif t == MsgType.REGISTER_ACK:
            self.book = decode_json(msg.body())
            self.node_id = int(self.book["node_id"])
            with self._lock:  # a late worker counts its barriers on from where the others are
                self._barrier_seq = max(self._barrier_seq, int(self.book.get("barrier_seq", 0)))
            if self.on_registered:
                self.on_registered(self.book)
            self._registered.set()
        elif t == MsgType.HEARTBEAT_ACK:
            pass
        elif t == MsgType.BARRIER_RELEASE:
            with self._lock:
                waiting = self._barriers.pop(msg.header.key, None)
            if waiting:
                waiting[0].set()
        elif t == MsgType.NODE_FAILED:
            d = decode_json(msg.body())
            reason = f"{d.get('who', 'a node')} failed: {d.get('reason', 'unknown reason')}"
            if d.get("pid") and d.get("hostname") == socket.gethostname():
                print_culprit(int(d["pid"]), reason)
            self.fail(reason)
        elif t == MsgType.TERMINATE:
            self.terminated.set()
            if self.on_message:
                self.on_message(msg)
        elif t == MsgType.PROGRESS:
            log.warning("%s", decode_json(msg.body()).get("text", ""))
        elif t == MsgType.ERROR and self._lost_since is not None and decode_json(msg.body()).get("recover"):
            self.fail(f"the new scheduler did not take this node back: {decode_json(msg.body()).get('error')}")
        elif t == MsgType.ERROR and not self._registered.is_set():
            d = decode_json(msg.body())
            self.fail(f"registration failed: {d.get('error')}")
            self._registered.set()
        elif self.on_message:
            self.on_message(msg)
        else:
            log.warning("unexpected %s from the scheduler ignored", t.name)
