"""The server process.

The I/O thread receives; INIT (the first push of a key, which doubles as a
barrier and carries name, length, dtype and compression) is handled there;
pushes and pulls of a key go, in arrival order, to the engine thread that owns
the key (``key % BYTEPS_SERVER_ENGINE_THREAD``), which sums with NumPy and
answers. Nothing a worker sends can crash the server: bad requests get an ERROR
reply naming the tensor and the ranks.

As ps-lite separates its Postoffice from its KVServer, the :class:`Server` here serves, and holds two
smaller parts: :class:`~pushpull.server.members.Members` (who the workers are, which rank a connection is,
RESETs) and :class:`~pushpull.server.declare.Declarations` (INIT: the workers' agreement on each key, and
its shared memory).
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np
import zmq

from pushpull import metrics
from pushpull.cluster import nodes
from pushpull.cluster.assign import PART_BITS
from pushpull.cluster.address import advertised_host, bind_error, bind_host
from pushpull.cluster.member import ClusterError
from pushpull.config import Config
from pushpull.server.declare import Declarations
from pushpull.server.keystate import Busy, Disagreement, KeyState, RoundError
from pushpull.server.members import Members
from pushpull.server.reduce import wire_view
from pushpull.server.sparse import SparseStore
from pushpull.transport.protocol import (
    OUTER_PRESENT_ONLY, STATE_READ, STATE_WRITE, Flags, Header, Msg, MsgType, ProtocolError, backup_extra, bits_f32,
    decode_json, dtype_code, dtype_name, encode_json,
)
from pushpull.transport import shm
from pushpull.transport.lane import lane_key, lane_sealed
from pushpull.transport.memory import keep_freed_buffers
from pushpull.transport.security import auth_for, is_loopback
from pushpull.transport.van import BesideLane, Van

log = logging.getLogger(__name__)

SOCK = "workers"
_SPARSE = (MsgType.SPARSE_INIT, MsgType.SPARSE_PUSH, MsgType.SPARSE_PULL, MsgType.SPARSE_COPY)
_DEADLINE = object()  # an engine-queue item: check this outer key's round deadline (on the key's own thread)
_FROM_WORKERS = (MsgType.PUSH, MsgType.PULL, MsgType.INIT, MsgType.STATUS, MsgType.CODEC_STATE, *_SPARSE)
_PUSH_PULL = (MsgType.PUSH, MsgType.PULL)
AWAITED_AFTER_S = 1.0  # metrics: a round open this long names the ranks it still waits for


def scheduled(items: list, q: queue.SimpleQueue) -> tuple[list, bool]:
    """BYTEPS_SERVER_ENABLE_SCHEDULE: everything queued for an engine thread so far (``items`` and whatever
    else waits in ``q``), keys that have received fewer pushes first, so a key that lags behind the others
    is summed (and its round answered) before keys that are ahead. The sort is stable and a key's requests
    share its count, so each key's pushes and pulls keep their arrival order. Also says whether the stop
    marker (None) was among them."""
    batch, stop = list(items), False
    while True:
        try:
            more = q.get_nowait()
        except queue.Empty:
            break
        if more is None:
            stop = True
            break
        batch.extend(more)
    batch.sort(key=lambda item: item[2].pushes)
    return batch, stop


class Server:
    """A server: its sockets, the engine threads that sum, and the push/pull of every round (ps-lite's KVServer);
    membership and declarations are the parts it holds (``members``, ``declarations``)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.van = Van("server", batch_bytes=cfg.batch_bytes, auth=auth_for(cfg, "server"))
        self.host = advertised_host(cfg)
        listen = bind_host(cfg, self.host)
        try:
            self.port = self.van.bind_router(SOCK, listen, 0, self._handle, advertised=self.host,
                                             max_message_bytes=cfg.max_message_bytes)
        except zmq.ZMQError as e:
            raise bind_error(listen, 0, e) from None
        info = {"role": "server", "host": self.host, "port": self.port}
        # lanes (pushpull.transport.lane): plain sockets for the workers' direct path and their pushes and pulls,
        # encrypted where ZeroMQ's traffic is (pushpull.transport.seal); their messages reach _handle like the
        # ROUTER's
        if cfg.direct_lane:
            try:
                info["lane"] = self.van.bind_lane(SOCK, listen, lane_key(self.van.auth), cfg.max_message_bytes,
                                                  local=is_loopback(self.host) and cfg.local_ipc, advertised=self.host,
                                                  sealed=lane_sealed(self.van.auth, self.host))
            except OSError as e:
                raise bind_error(listen, 0, e) from None
        # workers on this host (on loopback, or colocated with it) push and pull over an abstract Unix socket
        # instead of TCP (Van.bind_ipc; the workers find out whether they share the host: cluster.address)
        if cfg.local_ipc:
            ipc = self.van.bind_ipc(SOCK)
            if ipc:
                info["ipc"] = ipc
        # those workers also exchange large keys' payloads through shared memory (pushpull.transport.shm), unless
        # the job asked for encryption even on one host (PUSHPULL_AUTH=curve): payloads in files are not
        # encrypted. With auto, a colocated worker's payloads never reach a wire, as on loopback
        unencrypted = self.van.auth is None or self.van.auth.mode != "curve"
        regions = (shm.Regions() if cfg.local_shm and "ipc" in info and unencrypted and shm.available()
                   else None)
        self.members = Members(self.van, cfg, info, on_registered=self._on_registered,
                               on_message=self._scheduler_message)
        self.keys: dict[int, KeyState] = {}
        # a scheduler that takes the running job over learns the generation and the highest tensor key here
        self.members.cluster.recover_state = lambda: {
            "gen": self.members.gen, "max_key": max((k >> PART_BITS for k in list(self.keys)), default=0),
            "change": self.members.last_change}
        self.declarations = Declarations(cfg, self.members, self.keys, regions, self._reply, self._error)
        self.engines = [queue.SimpleQueue() for _ in range(cfg.server_engine_thread)]
        self._handoffs: dict[int, list] = {}  # engine -> requests of this pass (I/O thread only)
        self.threads = [threading.Thread(target=self._engine, args=(q,), name=f"engine-{i}", daemon=True)
                        for i, q in enumerate(self.engines)]
        # sparse tables (embedding rows by range, optimizer on the server): a module of their own
        self.sparse = SparseStore(cfg, self._reply, self._error,
                                  lambda: len(self.keys) + len(self.declarations.pending))
        self.van.call_later(1.0, self._check_inits, every=1.0)
        self.trace = None  # a ServerTrace once registered, with PUSHPULL_TRACE_ON=1

    def run(self) -> int:
        if self.cfg.server_enable_schedule and not self.engines:
            log.warning("BYTEPS_SERVER_ENABLE_SCHEDULE=1 has no effect with BYTEPS_SERVER_ENGINE_THREAD=0: "
                        "requests are served on the receiving thread as they arrive")
        if self.cfg.keep_freed_buffers:
            keep_freed_buffers()
        self.van.start()
        try:
            self.members.register()
        except ClusterError as e:
            log.error("%s", e)
            self.van.stop()
            return 1
        log.info("%s ready on %s:%d for %d workers", nodes.describe(self.members.node_id), self.host, self.port,
                 self.members.num_workers)
        index = self.members.node_id - nodes.SERVER_BASE
        endpoint = metrics.start("server", self.cfg.metrics_port + metrics.SERVER_PORT_OFFSET + index,
                                 self.cfg.metrics_host, self.metrics_samples,
                                 {"role": "server", "server": index}) if self.cfg.metrics_port else None
        try:
            code = self.members.wait()
        finally:  # SIGTERM raises SystemExit in this wait: the files still named go first, before anything can block
            if self.declarations.regions is not None:
                self.declarations.regions.unlink_all()
        summary = self.dropped_summary()
        if summary:
            log.warning("%s: %s", nodes.describe(self.members.node_id), summary)
        metrics.stop(endpoint)
        for q in self.engines:
            q.put(None)
        self.van.stop()
        if self.trace is not None:
            self.trace.flush()
        return code

    # ------------------------------------------------------------ replies --
    def _scheduler_message(self, msg: Msg) -> None:
        """RESET (elastic, or the end of a join): the workers changed. Drop every round in flight (the workers
        fail theirs and start again from round 1), expect the new number of pushes, map connections to their
        new ranks. JOINED: a worker ran out of data (join()): rounds complete without it from now on."""
        if msg.header.type == MsgType.JOINED:
            self.sparse.fail_all(f"rank {int(msg.header.key)} joined (join())")
            self._joined(int(msg.header.key))
            return
        if msg.header.type != MsgType.RESET:
            return
        d = decode_json(msg.body())
        if "joined_last" in d:  # the end of a join(): the tables failed when the first rank joined
            self.sparse.fail_all("a rank joined (join())")
        else:  # elastic: the workers declare every table again and load it from their copies
            self.sparse.drop_all()
        same = self.members.reset(d)  # the end of a join() keeps every rank where it was: shared regions stay
        self.sparse.num_workers = self.members.num_workers
        for ks in self.keys.values():
            if ks.shm is not None and not same:
                self.declarations.stop_sharing(ks)
            ks.shm_ranks = set()
            ks.reset(self.members.num_workers)
        self.declarations.pending.clear()  # the workers declare again what was pending
        self.declarations.codec_states.clear()  # (and load their compression state again)
        me = self.members.node_id - nodes.SERVER_BASE
        moved = {int(key): int(to) for key, to in d.get("moved", {}).items()}
        here = self.declarations.moved_here
        for key, to in moved.items():  # partitions that move to a replacement server leave this one
            if to != me:
                self.keys.pop(key, None)
                here.discard(key)
            else:  # until declared here: a worker declares it at its next use, which may be a change or two later
                here.add(key)
        (log.info if "joined_last" in d else log.warning)("workers changed (%s): generation %d, %d workers",
                                                          d.get("lost"), self.members.gen,
                                                          self.members.num_workers)
        self.members.ack_reset()

    def _joined(self, rank: int) -> None:
        """Rank ``rank`` called join(): it contributes nothing to the rounds the others still run (Horovod's
        join), so rounds and declarations that only waited for it complete now, and later ones without it."""
        self.members.joined.add(rank)
        self.declarations.joined(rank)
        for ks in self.keys.values():
            for slot in ks.complete_without_joined():
                for ident, r, req_id in slot.waiting:
                    if slot.error is not None:  # a broadcast cannot complete without the joined rank
                        self._error(ident, ks.key, slot.error, req_id)
                    else:
                        self._answer_pull(ident, r, req_id, ks.key, slot.round, ks, slot)
                slot.waiting.clear()

    def _reply(self, identity: bytes, header: Header, frames: list = ()) -> None:
        header.gen = self.members.gen
        header.sender = self.members.node_id
        self.van.send(SOCK, header, list(frames), identity=identity)

    def _ack(self, identity: bytes, h: Header) -> None:
        """PUSH_ACK: beside the worker's data lane, if it has one (:class:`pushpull.transport.van.BesideLane`)."""
        if b"." not in identity:
            identity = BesideLane(identity)
        self._reply(identity, Header(MsgType.PUSH_ACK, key=h.key, round=h.round, req_id=h.req_id))

    def _error(self, identity: bytes, key: int, text: str, req_id: int = 0) -> None:
        self.van.peer_log.warning((identity, "error"), "error to %r: %s", identity, text)
        self._reply(identity, Header(MsgType.ERROR, key=key, req_id=req_id), [encode_json({"error": text})])

    # ------------------------------------------------------------ I/O thread --
    def _on_registered(self) -> None:
        """Runs on the I/O thread once the address book is in (Members): the engines start, and the messages
        that came before it are handled."""
        self.sparse.num_workers = self.members.num_workers
        if self.cfg.trace_on:
            from pushpull.server.trace import ServerTrace

            self.trace = ServerTrace(self.cfg.trace_dir, self.members.node_id, self.cfg.trace_start_step,
                                     self.cfg.trace_end_step + 1)
        for t in self.threads:
            t.start()
        for identity, msg in self.members.take_early():
            self._handle(identity, msg)

    def _handle(self, identity: bytes, msg: Msg) -> None:
        h = msg.header
        if self.members.hold(identity, msg):  # before the address book: kept for later
            return
        try:
            if h.type in _FROM_WORKERS:
                if h.gen != self.members.gen:  # sent before the workers changed: its round no longer exists
                    return
                refusal = self.members.refusal(identity, h)
                if refusal is not None:
                    self._error(identity, h.key, refusal, h.req_id)
                    return
            if h.type in _PUSH_PULL:  # the usual message first
                if self.trace is not None:
                    msg.t_arrival = time.perf_counter()
                ks = self.keys.get(h.key)
                if ks is None:
                    self._error(identity, h.key, f"{h.type.name} for key {h.key} before its INIT completed",
                                h.req_id)
                    return
                self._on_key_thread(identity, msg, ks)
            elif h.type == MsgType.STATUS:
                self._status(identity, h)
            elif h.type == MsgType.INIT:
                self.declarations.init(identity, msg)
            elif h.type in _SPARSE:
                self.sparse.handle(identity, msg)
            elif h.type == MsgType.CODEC_STATE:
                self._codec_state(identity, msg)
            else:
                self._error(identity, h.key, f"a server does not handle {h.type.name}", h.req_id)
        except ProtocolError as e:
            self._error(identity, h.key, f"bad {h.type.name}: {e}", h.req_id)

    def metrics_samples(self) -> list:
        """PUSHPULL_METRICS_PORT's figures of this server (pushpull.metrics), read when Prometheus scrapes (a
        glance from another thread: the dicts are copied before they are walked)."""
        keys = list(self.keys.values())
        return [("pushpull_server_keys", "gauge", "keys (partitions) this server holds", len(keys)),
                ("pushpull_server_declarations_pending", "gauge", "keys declared by some workers, not yet all",
                 len(self.declarations.pending)),
                ("pushpull_server_rounds", "gauge", "rounds completed over every key in this generation",
                 sum(ks.completed for ks in keys)),
                ("pushpull_server_queue_depth", "gauge", "requests queued for the summation threads",
                 sum(q.qsize() for q in self.engines)),
                ("pushpull_server_late_pushes_total", "counter", "late pushes dropped (backup workers)",
                 sum(sum(ks.dropped.values()) for ks in keys)),
                ("pushpull_server_round_seconds_total", "counter", "first push to sum, over every round completed "
                 "(divided by pushpull_server_rounds_timed_total: the mean round latency)", sum(ks.round_s for ks in keys)),
                ("pushpull_server_rounds_timed_total", "counter", "rounds whose latency is in round_seconds_total",
                 sum(ks.rounds_timed for ks in keys)),
                ("pushpull_workers", "gauge", "the job's workers now", self.members.num_workers),
                ("pushpull_generation", "gauge", "changes of the job's workers so far (elastic)", self.members.gen),
                *self._awaited_samples(keys)]

    def _awaited_samples(self, keys: list) -> list:
        """One sample per rank that rounds open for over a second still wait for: how many such rounds (the
        late or missing ranks, by name; no sample for a rank nothing waits for)."""
        now, count = time.monotonic(), {}
        for ks in keys:
            for rank in ks.awaited(AWAITED_AFTER_S, now):
                count[rank] = count.get(rank, 0) + 1
        return [("pushpull_server_rounds_awaiting", "gauge", f"rounds open over {AWAITED_AFTER_S:.0f} s still "
                 f"waiting for this rank's push", n, {"rank": str(rank)}) for rank, n in sorted(count.items())]

    def dropped_summary(self) -> str:
        """Late pushes dropped per key and rank (backup workers), for the log at shutdown."""
        parts = [f"{ks.name} {dict(sorted(ks.dropped.items()))}" for ks in self.keys.values() if ks.dropped]
        if not parts:
            return ""
        per_rank: dict[int, int] = {}
        for ks in self.keys.values():
            for r, c in ks.dropped.items():
                per_rank[r] = per_rank.get(r, 0) + c
        return (f"late pushes dropped (backup workers), per rank over {len(parts)} key(s): "
                f"{dict(sorted(per_rank.items()))}; per key: " + "; ".join(parts[:8])
                + (f"; ... {len(parts) - 8} more" if len(parts) > 8 else ""))

    def _status(self, identity: bytes, h: Header) -> None:
        """Which ranks key ``h.key`` has heard from, for round ``h.round`` (or its INIT if still pending), so
        that a worker whose wait timed out can name the ranks it waits for (read on the I/O thread: a glance,
        not a lock-step view of an engine thread's sum)."""
        if self.sparse.owns(h.key):
            self.sparse.status(identity, h)
            return
        pend = self.declarations.pending.get(h.key)
        ks = self.keys.get(h.key)
        if ks is not None:
            everyone = ks.expected()
        elif pend is not None:
            everyone = self.declarations.expected(pend)
        else:
            everyone = set(range(self.members.num_workers))
        if pend is not None:
            have, stage = set(pend["by"]), "declared it"
        elif ks is not None:
            slot = ks.slots[h.round % len(ks.slots)]
            have, stage = (set(slot.pushed) if slot.round == h.round else set()), f"pushed round {h.round} of it"
        else:
            have, stage = set(), "declared it"
        dropped = {str(r): c for r, c in sorted(ks.dropped.items())} if ks is not None else {}
        self._reply(identity, Header(MsgType.STATUS_RESP, key=h.key, round=h.round),
                    [encode_json({"stage": stage, "have": sorted(have), "missing": sorted(everyone - have),
                                  "dropped": dropped})])

    def _codec_state(self, identity: bytes, msg: Msg) -> None:
        """CODEC_STATE: a key's server-side compression state read at an elastic commit, or loaded back after a
        change; on the key's engine thread, in order with its pushes. A load for a key that moved here and is not
        declared yet waits with its declaration (declare.py)."""
        h = msg.header
        ks = self.keys.get(h.key)
        if ks is None:
            if h.numel != STATE_WRITE:
                self._error(identity, h.key, f"CODEC_STATE for key {h.key}, which this server does not hold",
                            h.req_id)
                return
            d, body = self.declarations, msg.body_view()
            if h.key in d.moved_here and len(body):  # (an empty one asks for this server's own copy: none here)
                kept = d.codec_states.get(h.key)
                if kept is None or h.extra >= kept[1]:  # one per key, the newest commit's
                    d.codec_states[h.key] = (bytes(body), h.extra, h.gen)
            elif len(body):  # nothing to load it into: the worker goes on (the key starts from zero if declared)
                log.warning("rank %d loaded the compression state of key %d, which this server neither holds nor "
                            "was given by a change; dropped", h.sender, h.key)
            self._reply(identity, Header(MsgType.CODEC_STATE, key=h.key, round=h.round, numel=h.numel,
                                         req_id=h.req_id), [b""])
            return
        if ks.codec is None or ks.outer is not None or ks.store is not None:
            self._error(identity, h.key, f"tensor {ks.name!r}: no compression state on the server", h.req_id)
            return
        self._on_key_thread(identity, msg, ks)

    def _codec_state_op(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        h = msg.header
        if h.numel == STATE_READ:
            if h.round != ks.completed:
                raise RoundError(f"tensor {ks.name!r}: rank {h.sender} asked for its compression state as of round "
                                 f"{h.round}, the key completed round {ks.completed} (commit between steps, with "
                                 f"nothing in flight)")
            body = ks.codec.state(h.extra)
        elif h.numel == STATE_WRITE:
            state = msg.body_view()
            try:
                ks.codec.load(state, h.extra, h.gen) if len(state) else ks.codec.rollback(h.extra, h.gen)
            except ValueError:
                ks.codec.drop(h.gen)  # from zero, as its error says: not the state the change left
                raise
            body = b""
        else:
            raise ProtocolError(f"CODEC_STATE step {h.numel}")
        self._reply(identity, Header(MsgType.CODEC_STATE, key=h.key, round=h.round, numel=h.numel, req_id=h.req_id),
                    [body])

    def _check_inits(self) -> None:
        self.sparse.check_inits(self.cfg.timeout)
        for ks in list(self.keys.values()):  # DiLoCo's round deadline: on the key's own thread
            if ks.outer is not None and ks.outer_deadline is not None and ks.outer_rounds:
                if self.engines and not ks.inline:
                    self._hand_off(ks.key % len(self.engines), (None, _DEADLINE, ks))
                else:
                    self._outer_deadline(ks)
        self.declarations.check_timeouts()

    # ------------------------------------------------------------ engines --
    def _on_key_thread(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        """Serve ``msg`` on the engine thread that owns its key, in order with the key's other requests; a small key
        (or no engine threads) is served here, on the I/O thread (zmq's own thread keeps receiving meanwhile)."""
        if self.engines and not ks.inline:
            self._hand_off(ks.key % len(self.engines), (identity, msg, ks))
        else:
            self._serve(identity, msg, ks)

    def _hand_off(self, engine: int, item: tuple) -> None:
        """Queue a request for its engine thread; the requests of one pass of the I/O loop go
        over together at its end (one wake-up, and no engine queueing for the GIL mid-pass)."""
        if not self._handoffs:
            self.van.at_pass_end(self._flush_handoffs)
        self._handoffs.setdefault(engine, []).append(item)

    def _flush_handoffs(self) -> None:
        handoffs, self._handoffs = self._handoffs, {}
        for engine, items in handoffs.items():
            self.engines[engine].put(items)

    def _engine(self, q: queue.SimpleQueue) -> None:
        schedule = self.cfg.server_enable_schedule
        while True:
            items = q.get()
            if items is None:
                return
            stop = False
            if schedule:
                items, stop = scheduled(items, q)
            for item in items:
                self._serve(*item)
            if stop:
                return

    def _serve(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        """One push or pull of a key, on its engine thread (or on the I/O thread with 0 engines); then the
        pushes that waited for a late rank's pull (backup workers), once each."""
        self._serve_one(identity, msg, ks)
        while ks.deferred:
            waiting, ks.deferred = ks.deferred, []
            for ident, m in waiting:
                self._serve_one(ident, m, ks)
            if len(ks.deferred) == len(waiting):  # none could go yet
                return

    def _serve_one(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        if msg is _DEADLINE:
            self._outer_deadline(ks)
            return
        h = msg.header
        if h.gen != self.members.gen:  # queued before the workers changed (a RESET since): its round no longer exists
            return
        try:
            if h.type == MsgType.CODEC_STATE:
                self._codec_state_op(identity, msg, ks)
            elif ks.store is not None:
                self._async_op(identity, msg, ks)
            elif ks.outer is not None:
                self._outer_op(identity, msg, ks)
            elif h.type == MsgType.PUSH:
                self._push(identity, msg, ks)
            else:
                self._pull(identity, msg, ks)
        except (RoundError, ProtocolError, ValueError) as e:
            self._error(identity, h.key, str(e), h.req_id)
        except Exception as e:  # never let one bad request kill an engine thread
            log.exception("engine failed on %s for %r", h.type.name, ks.name)
            self._error(identity, h.key, f"server error on tensor {ks.name!r}: {e!r}", h.req_id)

    def _decode_push(self, msg: Msg, ks: KeyState) -> np.ndarray:
        h = msg.header
        if h.flags & Flags.SHM:  # in the sender's slot of the key's region (its rank is its connection's)
            region, slot = ks.shm, ks.shm_slot.get(h.sender)  # read once: a RESET may stop the sharing meanwhile
            if region is None or slot is None or h.flags & Flags.COMPRESSED:
                raise ProtocolError(f"tensor {ks.name!r}: rank {h.sender} pushed through shared memory, which "
                                    f"this key does not have for it")
            buf = region.push(slot)
        else:
            buf = msg.body_view()
        if ks.op == "concat":  # a slice: its bytes go at the offset in ``extra``
            if dtype_name(h.dtype) != "uint8" or len(buf) != h.numel or h.extra + len(buf) > ks.numel:
                raise ProtocolError(f"tensor {ks.name!r}: rank {h.sender} pushed {len(buf)} bytes at offset "
                                    f"{h.extra} of a {ks.numel}-byte concat key")
            return np.frombuffer(buf, dtype=np.uint8)
        if h.flags & Flags.COMPRESSED:
            if ks.codec is None:
                raise ProtocolError(f"tensor {ks.name!r}: compressed push but no compression was declared")
            ks.codec.lr = bits_f32(h.extra)  # the workers' learning rate, for the sum's error feedback
            return ks.codec.decompress_push(h.sender, buf)
        if h.numel != ks.numel or h.dtype != ks.code:
            raise ProtocolError(f"tensor {ks.name!r}: rank {h.sender} pushed {dtype_name(h.dtype)}[{h.numel}], "
                                f"the tensor is {ks.dtype}[{ks.numel}]")
        want = ks.wire_nbytes
        if len(buf) != want:
            raise ProtocolError(f"tensor {ks.name!r}: rank {h.sender} pushed {len(buf)} bytes for "
                                f"{ks.numel} elements of {ks.dtype} ({want} bytes)")
        return wire_view(buf, ks.dtype)

    def _push(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        h = msg.header
        if ks.shm_unseen:
            self.declarations.pushed_once(ks, h.sender)
        try:
            if h.flags & Flags.ABORT:  # raises Disagreement (the round fails), or returns: nothing to fail
                ks.abort(h.round, h.sender, str(decode_json(msg.body()).get("error", "aborted")))
                return
            late = ks.late(h.round, h.sender)
            if late is not None:  # backup workers: its round completed without it; it gets that round's sum
                if not h.flags & Flags.NO_ACK:
                    self._ack(identity, h)
                if h.flags & Flags.PULL:
                    ks.pull(h.round, h.sender)
                    self._answer_pull(identity, h.sender, h.req_id, h.key, h.round, ks, late)
                return
            data = self._decode_push(msg, ks)
            done = ks.push(h.round, h.sender, data, h.req_id, h.extra if ks.op == "concat" else 0)
        except Busy:  # backup workers: a late rank has not pulled the round this slot holds yet
            if len(ks.deferred) >= 2 * self.members.num_workers:
                raise RoundError(f"tensor {ks.name!r}: more than {len(ks.deferred)} pushes wait for a late rank")
            ks.deferred.append((identity, msg))
            return
        except Disagreement as e:  # every rank of the round gets the error, those already waiting too
            for ident, _, req_id in e.slot.waiting:
                self._error(ident, h.key, str(e), req_id)
            e.slot.waiting.clear()
            self._error(identity, h.key, str(e), h.req_id)
            return
        if self.trace is not None:
            self.trace.push(ks.name, h.key, h.round, h.sender, getattr(msg, "t_arrival", time.perf_counter()),
                            done is not None)
        if not h.flags & Flags.NO_ACK:
            self._ack(identity, h)
        if h.flags & Flags.PULL:  # the pull rides on the push (ps-lite's ZPushPull): answered with the round
            self._answer_in(ks, h)
            ks.pull(h.round, h.sender).waiting.append((identity, h.sender, h.req_id))
        if done is not None:
            for ident, rank, req_id in done.waiting:
                self._answer_pull(ident, rank, req_id, h.key, h.round, ks, done)
            done.waiting.clear()

    @staticmethod
    def _answer_in(ks: KeyState, h: Header) -> None:
        """Remember whether rank ``h.sender`` wants this request's answer in the key's shared output."""
        if h.flags & Flags.SHM and ks.shm is not None:
            ks.shm_ranks.add(h.sender)
        else:
            ks.shm_ranks.discard(h.sender)

    def _pull(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        h = msg.header
        self._answer_in(ks, h)
        slot = ks.pull(h.round, h.sender)
        if slot.ready:
            self._answer_pull(identity, h.sender, h.req_id, h.key, h.round, ks, slot)
        else:
            slot.waiting.append((identity, h.sender, h.req_id))

    def _answer_pull(self, identity, rank, req_id, key, rnd, ks: KeyState, slot) -> None:
        slot.pulled.add(rank)
        if ks.readers is not None and rank not in ks.readers:  # it only contributed: the round is complete
            self._reply(identity, Header(MsgType.PULL_RESP, key=key, round=rnd, req_id=req_id,
                                         dtype=dtype_code(ks.dtype), numel=0, nbytes=0), [b""])
            return
        if rank in ks.shm_ranks:  # the sum is in the region's output of this round's slot
            self._reply(identity, Header(MsgType.PULL_RESP, key=key, round=rnd, req_id=req_id,
                                         dtype=dtype_code(ks.dtype), numel=ks.numel, nbytes=ks.wire_nbytes,
                                         flags=Flags.SHM, extra=rnd % len(ks.slots)), [b""])
            return
        if slot.wire is None:
            slot.wire = self.van.shared_frame(slot.out)
        compressed = ks.codec is not None and ks.outer is None  # an outer key answers whole parameters
        # backup workers: how many pushes the sum holds (the average's divisor) and how many rounds have
        # completed after this one (a late rank catches up on them by pulling)
        extra = backup_extra(slot.count, ks.completed - rnd) if ks.backup else 0
        self._reply(identity, Header(MsgType.PULL_RESP, key=key, round=rnd, req_id=req_id,
                                     dtype=dtype_code(ks.dtype), numel=ks.numel, nbytes=len(slot.wire),
                                     flags=Flags.COMPRESSED if compressed else 0, extra=extra),
                    [slot.wire])

    def _outer_op(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        """An outer key (DiLoCo, local SGD; pushpull.outer): pushes of pseudo-gradients matched by their round's
        id (the request id, the round signature every worker gives alike), answered with the new global
        parameters once every worker present pushed; an ABORT fails the open rounds."""
        h = msg.header
        if h.type != MsgType.PUSH:
            raise ProtocolError(f"tensor {ks.name!r}: an outer key is only pushed (the pull rides on the push)")
        if h.flags & Flags.ABORT:
            text = str(decode_json(msg.body()).get("error", "aborted"))
            for slot in ks.outer_rounds.values():
                for ident, _, req_id, _ in slot.waiting:
                    self._error(ident, h.key, text, req_id)
            ks.outer_rounds.clear()
            return
        data = self._decode_push(msg, ks)
        slot = ks.outer_push(h.req_id & ~OUTER_PRESENT_ONLY, h.sender, data, (identity, h.sender, h.req_id, h.round),
                             counts=not h.req_id & OUTER_PRESENT_ONLY)
        if not h.flags & Flags.NO_ACK:
            self._ack(identity, h)
        if slot is None:
            return
        for ident, rank, req_id, rnd in slot.waiting:  # each worker's answer under its own round number
            self._answer_pull(ident, rank, req_id, h.key, rnd, ks, slot)
        slot.waiting.clear()

    def _outer_deadline(self, ks: KeyState) -> None:
        """Complete the outer rounds of ``ks`` that are past their deadline with the pushes they have, and
        answer those workers; the others' late pushes get the result (KeyState.outer_push)."""
        for slot, missing in ks.outer_overdue(time.monotonic()):
            log.warning("tensor %r: outer round %d completed after its deadline (%.1fs) with rank(s) %s; rank(s) %s "
                        "had not pushed and do not count in it", ks.name, slot.round, ks.outer_deadline_s() or 0.0,
                        sorted(slot.pushed), missing)
            for ident, rank, req_id, rnd in slot.waiting:
                self._answer_pull(ident, rank, req_id, ks.key, rnd, ks, slot)
            slot.waiting.clear()

    def _async_op(self, identity: bytes, msg: Msg, ks: KeyState) -> None:
        """A store key (asynchronous training): a push adds a delta to the parameters, a pull returns them at
        once. Only members reach this: ``_handle`` checked the sender against its authenticated connection."""
        h = msg.header
        assert ks.store is not None
        if h.type == MsgType.PUSH:
            data = self._decode_push(msg, ks)
            np.add(ks.store, data, out=ks.store, casting="unsafe")
            if not h.flags & Flags.NO_ACK:
                self._ack(identity, h)
        if h.type == MsgType.PULL or h.flags & Flags.PULL:
            from pushpull.server.reduce import Accumulator

            acc = Accumulator(ks.dtype, ks.numel)
            acc.acc = ks.store.copy()
            out = acc.result()
            self._reply(identity, Header(MsgType.PULL_RESP, key=h.key, round=h.round, req_id=h.req_id,
                                         dtype=dtype_code(ks.dtype), numel=ks.numel, nbytes=out.nbytes), [out])


def run_server(cfg: Config) -> int:
    return Server(cfg).run()
