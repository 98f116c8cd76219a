"""The worker's key-value client: the thin layer between the tensor pipeline and the van.

It knows keys, not tensors. It numbers its requests to the scheduler (ASSIGN: request id -> the entry
that asked), sends a partition's INIT, PUSH and PULL with this worker's rank and membership generation
stamped on them, holds credit for each push in flight and returns it at the PUSH_ACK, and matches each
answer to its request, through one table from message type to handler (:attr:`KVClient.server_handlers`,
:attr:`KVClient.scheduler_handlers`). What an answer means for a tensor is the pipeline's business: the
client calls the :class:`Upper` it was given.

Everything here runs on the van's I/O thread, except the constructor.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

from pushpull.transport import shm
from pushpull.transport.protocol import Flags, Header, Msg, MsgType, decode_json, encode_json
from pushpull.worker.credit_queue import CreditQueue
from pushpull.worker.table import Entry, Op, Partition
from pushpull.worker.window import AutoWindow

log = logging.getLogger(__name__)


class Upper(Protocol):
    """What the key-value client reports to the layer above it (the tensor pipeline)."""

    entries: dict[str, Entry]  # the tensor table, by name (a scheduler's ERROR names a tensor)

    def on_assigned(self, e: Entry, result: dict) -> None: ...     # ASSIGN_ACK: where its partitions live
    def on_inited(self, e: Entry) -> None: ...                     # one more partition's INIT_ACK
    def on_pulled(self, msg: Msg, op: Op, p: Partition) -> None: ...  # a PULL_RESP for a push in flight
    def fail_entry(self, e: Entry, error: str) -> None: ...        # an ERROR about a tensor
    def fail_message(self, msg: Msg, error: str) -> None: ...      # handling an answer raised
    def on_reset(self, d: dict) -> None: ...                       # RESET: the workers changed


class KVClient:
    """INIT/PUSH/PULL of partitions to their servers, ASSIGN to the scheduler, credit, answer routing.

    ``parts``: key -> (its entry, its partition), filled when the scheduler assigns a tensor.
    ``inflight``: key -> the op whose push (or pull) is on the wire. ``queue``: the credit queue; while a
    ``window`` is set (BYTEPS_SCHEDULING_CREDIT=auto over a network) its size follows the round trips
    measured at PUSH_ACK. ``send_next``: the pipeline's stage the queue admits partitions into."""

    def __init__(self, van, member, rank: int, upper: Upper, credit_bytes: int = 0):
        self.van = van
        self.member = member
        self.rank = rank
        self.gen = 0  # membership generation (elastic training); stamped on every message
        self.upper = upper
        self.parts: dict[int, tuple[Entry, Partition]] = {}
        self.inflight: dict[int, Op] = {}
        self.queue: CreditQueue = CreditQueue(credit_bytes)
        self.window: AutoWindow | None = None
        self.send_next: Callable[[tuple, int], None] | None = None
        # the sockets of servers on this host that may give a key a shared-memory region (PUSHPULL_LOCAL_SHM),
        # and the job's size (no region has more slots than workers); set by the engine at start
        self.shm_socks: set[str] = set()
        self.shm_min_bytes = shm.MIN_KEY_BYTES  # partitions up to this size keep their payload on the socket
        self.num_workers = 0
        self.trace_ack: Callable[[int, int], None] | None = None  # the tracer's push_acked, while tracing
        self._req = 0
        self.requests: dict[int, Entry] = {}  # ASSIGN request id -> the entry that asked
        self.server_handlers: dict[MsgType, Callable[[Msg], None]] = {
            MsgType.INIT_ACK: self._on_init_ack,
            MsgType.PUSH_ACK: self._on_push_ack,
            MsgType.PULL_RESP: self._on_pull_resp,
            MsgType.ERROR: self._on_server_error,
        }
        self.scheduler_handlers: dict[MsgType, Callable[[Msg], None]] = {
            MsgType.ASSIGN_ACK: self._on_assign_ack,
            MsgType.ERROR: self._on_scheduler_error,
            MsgType.RESET: lambda msg: self.upper.on_reset(decode_json(msg.body())),
            MsgType.TERMINATE: lambda msg: None,
        }

    # ------------------------------------------------------------ requests --
    def assign(self, e: Entry) -> None:
        """Ask the scheduler where ``e``'s partitions live; the answer comes to ``upper.on_assigned``."""
        self._req += 1
        self.requests[self._req] = e
        self.member.send(Header(MsgType.ASSIGN, req_id=self._req), [encode_json(e.assign_request())])

    def assign_again(self) -> None:
        """A new scheduler took the job over: the ASSIGNs the lost one never answered go to it."""
        for req, e in list(self.requests.items()):
            self.member.send(Header(MsgType.ASSIGN, req_id=req), [encode_json(e.assign_request())])

    def cancel(self, e: Entry) -> None:
        """Forget ``e``'s ASSIGN requests (the scheduler failed the tensor)."""
        self.requests = {k: v for k, v in self.requests.items() if v is not e}

    def init(self, p: Partition, dtype: int, numel: int, body: bytes, seed: list = ()) -> None:
        """INIT of ``p`` (``seed``: an outer key's state, frames after the JSON body)."""
        self.van.send(p.sock, Header(MsgType.INIT, sender=self.rank, key=p.key, dtype=dtype, gen=self.gen,
                                     numel=numel), [body, *seed])

    def push(self, p: Partition, rnd: int, dtype: int, numel: int, nbytes: int, flags: int, extra: int,
             sig: int, frame) -> None:
        """One PUSH of ``frame`` for round ``rnd`` (``sig`` rides in the request id: the server compares it)."""
        self.van.send(p.sock, Header(MsgType.PUSH, sender=self.rank, key=p.key, round=rnd, dtype=dtype,
                                     gen=self.gen, numel=numel, nbytes=nbytes, flags=flags, extra=extra,
                                     req_id=sig), [frame])

    def pull(self, p: Partition, rnd: int, dtype: int, numel: int) -> None:
        self.van.send(p.sock, Header(MsgType.PULL, sender=self.rank, key=p.key, round=rnd, dtype=dtype,
                                     gen=self.gen, numel=numel), [])

    def abort(self, p: Partition, rnd: int, dtype: int, body: bytes) -> None:
        """A PUSH that fails round ``rnd`` of the key on every rank with ``body`` ({"error": ...})."""
        self.van.send(p.sock, Header(MsgType.PUSH, sender=self.rank, key=p.key, round=rnd, gen=self.gen,
                                     dtype=dtype, flags=Flags.ABORT), [body])

    def push_flags(self) -> int:
        """One request carries the push and the pull; the PUSH_ACK is wanted only to return a limited
        credit early or for the trace (half the messages per partition otherwise)."""
        if self.queue.credit_bytes <= 0 and self.trace_ack is None:
            return Flags.PULL | Flags.NO_ACK
        return Flags.PULL

    # ------------------------------------------------------------ credit --
    def admit(self) -> None:
        """Send what the credit now allows (to ``send_next``)."""
        self.queue.admit(self.send_next)

    def hold(self, op: Op, p: Partition, nbytes: int) -> None:
        """``p``'s push for ``op`` is going out holding ``nbytes`` of credit."""
        self.inflight[p.key] = op
        p.held = nbytes
        if self.window is not None:
            p.t_sent = time.perf_counter()

    def done(self, p: Partition) -> None:
        """``p``'s request is answered: it leaves the wire, its credit (if still held) goes back."""
        del self.inflight[p.key]
        if p.held:
            self.queue.release(p.held)
            p.held = 0

    def drop(self, op: Op, parts: list) -> None:
        """``op`` ended early: those of ``parts`` still on the wire for it give their credit back."""
        inflight = self.inflight
        for p in parts:
            if inflight.get(p.key) is op:
                del inflight[p.key]
                if p.held:
                    self.queue.release(p.held)
                    p.held = 0

    # ------------------------------------------------------------ answers --
    def on_server_message(self, msg: Msg) -> None:
        """A failure while handling a server's answer fails that tensor's op at once,
        with the cause, instead of leaving it to time out."""
        h = msg.header
        try:
            if h.gen != self.gen:  # an answer from before the workers changed (elastic): its op already failed
                return
            handler = self.server_handlers.get(h.type)
            if handler is None:
                log.warning("unexpected %s from a server ignored", h.type.name)
                return
            handler(msg)
        except Exception as ex:
            log.exception("handling %s for key %d failed", h.type.name, h.key)
            self.upper.fail_message(msg, f"handling the server's {h.type.name} failed: {ex!r}")

    def on_scheduler_message(self, msg: Msg) -> None:
        handler = self.scheduler_handlers.get(msg.header.type)
        if handler is None:
            log.warning("unexpected %s from the scheduler ignored", msg.header.type.name)
            return
        handler(msg)

    def _on_assign_ack(self, msg: Msg) -> None:
        e = self.requests.pop(msg.header.req_id, None)
        if e is not None:
            self.upper.on_assigned(e, decode_json(msg.body()))

    def _on_scheduler_error(self, msg: Msg) -> None:
        d = decode_json(msg.body())
        name = d.get("tensor")
        e = self.upper.entries.get(name) if name else None
        if e is not None:
            self.cancel(e)
            self.upper.fail_entry(e, d.get("error", "error"))
        elif name:  # not declared here yet: the scheduler repeats it when this worker does
            log.info("scheduler error for a tensor not declared here yet: %s", d.get("error"))
        else:
            log.error("scheduler error: %s", d.get("error"))

    def _on_init_ack(self, msg: Msg) -> None:
        ep = self.parts.get(msg.header.key)
        if ep is None:
            return
        e, p = ep
        if not p.inited:
            p.shm = p.shm_push = None  # a region of before (another server's, or another generation's) is gone
            body = msg.body()
            if body:  # the server's shared-memory region for this key (pushpull.transport.shm)
                d = decode_json(body)
                self._attach(p, d.get("shm") if isinstance(d, dict) else None)
            p.inited = True
            p.moved = False  # declared where it moved (with its seed, if it has one)
            self.upper.on_inited(e)

    def _attach(self, p: Partition, desc) -> None:
        """Map the region ``desc`` a server gave ``p``'s key; if it cannot be mapped (another /dev/shm, a
        file that is not what it should be), the key's payloads stay on the socket, and this worker offers
        that server no more regions (each would be reserved for nothing)."""
        if desc is None or p.sock not in self.shm_socks:
            return
        try:
            region, slot = shm.attach(desc, p.nbytes, self.num_workers)
        except (shm.AttachError, OSError) as ex:
            log.warning("worker %d: shared memory of server %d not used, payloads go over the socket: %s",
                        self.rank, p.server, ex)
            self.shm_socks.discard(p.sock)
            return
        p.shm, p.shm_push = region, region.push(slot)

    def _on_push_ack(self, msg: Msg) -> None:
        h = msg.header
        if self.trace_ack is not None:
            self.trace_ack(h.key, h.round)
        # credit covers the push only (as BytePS): holding it until the pull, which waits for
        # the other workers, deadlocks when workers admit partitions in different orders
        op = self.inflight.get(h.key)
        ep = self.parts.get(h.key)
        if op is not None and ep is not None and op.round == h.round and ep[1].held:
            p = ep[1]
            if self.window is not None and p.t_sent:
                self.queue.credit_bytes = self.window.on_ack(p.nbytes, time.perf_counter() - p.t_sent)
            self.queue.release(p.held)
            p.held = 0
            self.queue.admit(self.send_next)

    def _on_pull_resp(self, msg: Msg) -> None:
        h = msg.header
        op = self.inflight.get(h.key)
        ep = self.parts.get(h.key)
        if op is None or ep is None or op.round != h.round:
            log.warning("unexpected PULL_RESP for key %d round %d dropped", h.key, h.round)
            return
        self.upper.on_pulled(msg, op, ep[1])

    def _on_server_error(self, msg: Msg) -> None:
        text = decode_json(msg.body()).get("error", "unknown server error")
        ep = self.parts.get(msg.header.key)
        if ep is None:
            log.error("server error: %s", text)
            return
        self.upper.fail_entry(ep[0], text)
