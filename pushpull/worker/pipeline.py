"""The tensor pipeline: one push_pull's stages, on the communication thread, in the order they run.

    partition   cut a tensor into partitions of at most partition_bytes, on first use
                (:meth:`pushpull.worker.table.TensorTable.entry`, on the caller's thread)
    set up      ASSIGN (where each partition lives), then INIT (a per-key barrier)
                :meth:`start`, :meth:`on_assigned`, :meth:`send_inits`, :meth:`on_inited`, :meth:`ready`
    queue       every partition into the credit queue, by priority: :meth:`enqueue`
    compress    a partition the credit admitted, inline or on the codec pool: :meth:`compress`
    push/pull   one PUSH that also asks for the round's sum: :meth:`push`; the sum: :meth:`on_pulled`
                (with a server on this host, a large key's payloads go through its shared-memory region:
                the push is copied into this rank's slot, the sum read from the region's output)
    decompress  the sum, when it came compressed: :meth:`decompress`
    average     sum -> mean (:class:`pushpull.worker.average.Averager`): on arrival in :meth:`on_pulled`
                and :meth:`decompress`, the rest in :meth:`finish`
    output      the last partition (:meth:`pulled`) completes the op: device copy, handle released
                at the end of the I/O pass (:meth:`finish`)

Why all on one thread: every per-tensor state is touched here only, so it needs no locks; the caller's
thread only validates, registers the op and returns a handle. The messages themselves are the key-value
client's (:mod:`pushpull.worker.kv_client`), which calls back :meth:`on_assigned`, :meth:`on_inited`,
:meth:`on_pulled` and :meth:`fail_entry`.

Collaborators, handed in by the engine (never set from outside it): ``tracer`` (the timeline, while a
traced step runs; the one check each stage makes when tracing is off), ``lr`` (the optimizer's learning
rate, for error feedback), ``pool`` (BYTEPS_THREADPOOL_SIZE's codec threads: compression and
decompression off this thread, in parallel, as their kernels release the GIL).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from pushpull.cluster.assign import part_key
from pushpull.transport.protocol import OUTER_PRESENT_ONLY, Flags, Msg, encode_json, f32_bits, split_backup_extra
from pushpull.worker.average import NP_FLOAT, Averager
from pushpull.worker.handle import Handle, PushPullError, WorkersChanged
from pushpull.worker.kv_client import KVClient
from pushpull.worker.table import (
    ASSIGNING, FAILED, INITING, NEW, READY, Entry, Op, Partition, TensorTable,
)

log = logging.getLogger(__name__)


class Pipeline:
    """The stages of every push_pull through the engine (module docstring); the :class:`KVClient`'s upper."""

    def __init__(self, table: TensorTable, averager: Averager, stats: dict, on_reset: Callable[[dict], None],
                 on_errors: Callable[[int], None] | None = None):
        self.table = table
        self.entries = table.entries
        self.avg = averager
        self.stats = stats
        self.on_reset = on_reset          # RESET from the scheduler: the engine's
        self.kv: KVClient | None = None   # bound by the engine (the client reports back here)
        self.tracer = None                # collaborators: see the module docstring
        self.lr: Callable[[], float] | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.changed_reason = ""          # the last change of the job (elastic), as the ops it failed say
        self._completed: list[tuple[Handle, str | None, type]] = []  # released at the end of the van's pass
        self.active = 0                   # ops between start and finish, and since when one has been (metrics:
        self.busy_since = 0.0             # the engine's comm_s, the time with some reduction in flight)
        self.max_message_bytes = 1 << 62  # the largest message a server takes (the engine's configuration)

    def bind(self, kv: KVClient) -> None:
        self.kv = kv
        self.van = kv.van
        kv.send_next = self.compress

    def lr_now(self) -> float:
        """Current learning rate for error feedback (1.0 until an optimizer hands its getter in)."""
        return float(self.lr()) if self.lr is not None else 1.0

    # ------------------------------------------------------------ set up --
    def start(self, op: Op) -> None:
        """Number the op's round; on to the queue when its tensor is ready, else wait for the set-up."""
        e = op.entry
        op.active = True
        if not self.active:
            self.busy_since = time.perf_counter()
        self.active += 1
        if op.gen != self.kv.gen:  # submitted before a change of the job took effect: it belongs to no round
            self.finish(op, f"tensor {e.name!r}: {self.changed_reason}", WorkersChanged)
            return
        e.round += 1
        op.round = e.round
        state = e.state
        if state is FAILED:
            self.finish(op, e.error)
        elif state is READY:
            self.enqueue(op)
        else:
            e.waiting.append(op)
            if state is NEW:
                e.state = ASSIGNING
                self.kv.assign(e)
            elif e.declare_later:
                e.declare_later = False
                self.send_inits(e, [p for p in e.parts if not p.inited])

    def on_assigned(self, e: Entry, result: dict) -> None:
        """The scheduler's answer: each partition's key and server; then its codecs, then INIT."""
        if e.state is FAILED:  # abandoned by its caller meanwhile (a deadline): it stays unusable
            return
        base = int(result["key"])
        e.assigned = base
        parts = self.kv.parts
        for p, server in zip(e.parts, result["servers"]):
            p.key = part_key(base, p.index)
            p.server = int(server)
            p.sock = f"s{p.server}"
            parts[p.key] = (e, p)
        if e.compression:
            from pushpull.worker.codec import WorkerCodec

            itemsize = e.itemsize
            try:
                for p in e.parts:
                    p.codec = WorkerCodec(e.compression, e.dtype, p.nbytes // itemsize, key=p.key,
                                          lr_getter=self.lr_now)
            except (ValueError, TypeError) as ex:
                self.fail_entry(e, f"tensor {e.name!r}: compression {e.compression} rejected: {ex}")
                return
        e.state = INITING
        e.pending_inits = len(e.parts)
        if not e.parts:
            self.ready(e)
            return
        if not e.waiting:  # a change of the job failed the ops that asked: declared by the next one (restart)
            e.declare_later = True
            return
        self.send_inits(e, e.parts)

    def send_inits(self, e: Entry, parts: list) -> None:
        """INIT of ``parts``. A partition over 64 KiB of a whole, uncompressed reduction whose server is on
        this host offers to exchange its payloads through shared memory (the server decides). An outer key
        with a seed (it moved: its server was lost) carries its slice of the seed for the new server."""
        decl = {"name": e.name, "compression": e.compression, **e.spec.declaration()}
        body = encode_json(decl)
        kv = self.kv
        offer = None
        if kv.shm_socks and e.compression is None and e.spec.readers is None and e.spec.writers is None:
            offer = encode_json({**decl, "shm": True})
        itemsize = e.itemsize
        seed = self.table.seeds.get(e.name)  # read once: a user's thread may replace it (a store key's pull)
        for p in parts:
            shared = offer is not None and p.sock in kv.shm_socks and p.nbytes > kv.shm_min_bytes
            if seed is None or not p.moved:  # (p.moved stays until the INIT_ACK: sent again, it carries the seed)
                kv.init(p, e.code, p.nbytes // itemsize, offer if shared else body)
                continue
            rid, params, momentum = seed
            lo, n = p.offset // itemsize, p.nbytes // itemsize
            frames = [params[lo:lo + n]] + ([momentum[lo:lo + n]] if momentum is not None else [])
            if sum(f.nbytes for f in frames) + len(body) + 1024 > self.max_message_bytes:
                log.error("tensor %r: its seed (%d bytes for partition %d) is larger than a message may be "
                          "(PUSHPULL_MAX_MESSAGE_BYTES); the partition is declared without it, and its next round "
                          "fails", e.name, sum(f.nbytes for f in frames), p.index)
                kv.init(p, e.code, n, body)
                continue
            kv.init(p, e.code, n, encode_json({**decl, "seed": {"round": rid, "momentum": momentum is not None}}),
                    frames)

    def on_inited(self, e: Entry) -> None:
        e.pending_inits -= 1
        if e.pending_inits == 0 and e.state is INITING:
            self.ready(e)

    def ready(self, e: Entry) -> None:
        e.state = READY
        waiting, e.waiting = e.waiting, []
        for op in waiting:
            self.enqueue(op)

    def fail_entry(self, e: Entry, error: str) -> None:
        """The tensor is unusable (a server's or the scheduler's error): its ops fail, and every later one.
        The first cause stays (the servers echo an abandoned round's error back to the rank that gave up)."""
        if e.state is not FAILED or not e.error:
            e.error = error
        e.state = FAILED
        waiting, e.waiting = e.waiting, []
        for op in waiting:
            self.finish(op, error)
        for op in list(self.kv.inflight.values()):
            if op.entry is e:
                self.finish(op, error)

    def fail_message(self, msg: Msg, error: str) -> None:
        op = self.kv.inflight.get(msg.header.key)
        if op is not None:
            self.finish(op, f"tensor {op.entry.name!r}: {error}")

    # ------------------------------------------------------------ queue --
    def enqueue(self, op: Op) -> None:
        e = op.entry
        op.remaining = len(e.parts)
        if not e.parts:
            self.finish(op, None)
            return
        queue = self.kv.queue
        for p in e.parts:
            queue.push((op, p), p.nbytes, op.priority, p.index)
        queue.admit(self.compress)

    # ------------------------------------------------------------ compress --
    def compress(self, item, nbytes: int) -> None:
        """A partition the credit admitted: its bytes (a concat key's slice, a backup worker's pull, or
        the partition compressed) on to :meth:`push`."""
        op, p = item
        e = op.entry
        kv = self.kv
        if op.finished:  # the op failed while this partition was queued
            kv.queue.release(nbytes)
            return
        if self.tracer is not None:
            self.tracer.admitted(op, p)
        kv.hold(op, p, nbytes)
        if e.spec.op == "concat":  # this rank's bytes that fall in the partition, and where they go in it
            lo = max(p.offset, op.offset)
            hi = max(lo, min(p.offset + p.nbytes, op.offset + len(op.inp)))
            view = op.inp[lo - op.offset:hi - op.offset]
            kv.push(p, op.round, e.code, hi - lo, hi - lo, kv.push_flags(), lo - p.offset if hi > lo else 0,
                    op.sig, view)
            if self.tracer is not None:
                self.tracer.sent(p)
            self.stats["bytes_pushed"] += hi - lo
            self.stats["bytes_pushed_raw"] += hi - lo
            self.stats["partitions"] += 1
            return
        if op.round <= p.completed:  # backup workers: the round completed without us; only its sum is wanted
            kv.pull(p, op.round, e.code, p.nbytes // e.itemsize)
            self.stats["partitions"] += 1
            return
        view = op.inp[p.offset:p.offset + p.nbytes]
        flags = kv.push_flags()
        if p.codec is None:
            self.push(op, p, view, flags, 0)
            return
        flags |= Flags.COMPRESSED
        extra = f32_bits(self.lr_now())  # the server's error feedback rescales by the same lr ratio
        if self.pool is None:
            self.push(op, p, p.codec.compress(view), flags, extra)
            return
        gen = kv.gen

        def compressed(fut) -> None:  # on a pool thread: the rest belongs to the I/O thread
            self.van.call_soon(lambda: self._push_compressed(op, p, fut, flags, extra, gen))
        self.pool.submit(p.codec.compress, view,
                         lambda: not op.finished and gen == self.kv.gen).add_done_callback(compressed)

    def _push_compressed(self, op: Op, p: Partition, fut, flags: int, extra: int, gen: int) -> None:
        """A partition compressed on the pool (BYTEPS_THREADPOOL_SIZE): send it, unless its op ended meanwhile
        (its credit went back then) or the workers changed (its round no longer exists)."""
        if op.finished or self.kv.inflight.get(p.key) is not op or gen != self.kv.gen:
            return
        try:
            frame = fut.result()
        except Exception as ex:  # noqa: BLE001 - the op fails with the codec's error, as inline
            self.finish(op, f"tensor {op.entry.name!r}: compressing partition {p.index} failed: {ex!r}")
            return
        if frame is None:  # not wanted any more when its turn came (WorkerCodec.compress): the checks above say so
            return
        if self.kv.window is not None:  # the window's round trip starts at the send, not before compressing
            p.t_sent = time.perf_counter()
        self.push(op, p, frame, flags, extra)

    # ------------------------------------------------------------ push/pull --
    def push(self, op: Op, p: Partition, frame, flags: int, extra: int) -> None:
        e = op.entry
        if flags & Flags.COMPRESSED:
            nb = len(memoryview(frame).cast("B")) if not isinstance(frame, (bytes, bytearray)) else len(frame)
        else:
            nb = p.nbytes
            if p.shm_push is not None:  # into this rank's slot of the key's region; the message carries none
                np.copyto(p.shm_push, frame)
                flags |= Flags.SHM
                frame = b""
                self.stats["shm_pushes"] += 1
        self.kv.push(p, op.round, e.code, p.nbytes // e.itemsize, nb, flags, extra, op.sig, frame)
        if self.tracer is not None:
            self.tracer.sent(p)
        self.stats["bytes_pushed"] += nb
        self.stats["bytes_pushed_raw"] += p.nbytes
        self.stats["partitions"] += 1

    def on_pulled(self, msg: Msg, op: Op, p: Partition) -> None:
        """The round's sum of ``p`` for ``op`` (the client matched it): decompress or average it into the
        output, then the partition is done."""
        h = msg.header
        if self.tracer is not None:
            self.tracer.pull_received(h.key)
        buf = msg.body_view()
        inv = None
        if h.flags & Flags.SHM:  # the sum is in output ``extra`` of the key's region
            if p.shm is None or not 0 <= h.extra < len(p.shm.outs):
                self.finish(op, f"tensor {op.entry.name!r}: server {p.server} answered in shared memory output "
                                f"{h.extra}, which this key does not have")
                return
            buf = p.shm.out(h.extra)
        elif h.extra:  # backup workers: the sum holds ``count`` pushes; ``ahead`` rounds completed since
            count, ahead = split_backup_extra(h.extra)
            p.completed = max(p.completed, h.round + ahead)
            if count and op.average:
                inv = 1.0 / count
                if op.entry.dtype.name not in NP_FLOAT:  # averaged at the end, per partition
                    op.counts = (op.counts or []) + [(p.offset, p.nbytes, count)]
        if not op.reader:  # this rank only contributed: the answer says the round completed
            pass
        elif h.flags & Flags.COMPRESSED:
            if self.pool is not None:  # decompress on the pool; the partition completes when it is done
                gen = self.kv.gen

                def decompressed(fut) -> None:
                    self.van.call_soon(lambda: self._pulled_compressed(op, p, fut, len(buf), gen))
                self.pool.submit(self.decompress, op, p, buf, inv, msg).add_done_callback(decompressed)
                return
            self.decompress(op, p, buf, inv)
        else:
            error = self.avg.copy_sum(op.entry, p, buf, op.out_bytes[p.offset:p.offset + p.nbytes], op.average,
                                      inv)
            if error:
                self.finish(op, error)
                return
        self.pulled(op, p, len(buf))
        if self.kv.queue:
            self.kv.admit()

    # ------------------------------------------------------------ decompress --
    def decompress(self, op: Op, p: Partition, buf, inv: float | None = None, _keepalive=None) -> None:
        """A compressed sum into the output (averaging floats on the way, times ``inv``: 1/size, or 1/pushes
        summed with backup workers); ``_keepalive``: the message that owns ``buf`` while a pool thread reads it."""
        dst = op.out_bytes[p.offset:p.offset + p.nbytes]
        p.codec.decompress_into(buf, dst)
        self.avg.scale(dst, op.entry.dtype, op.average, inv)

    def _pulled_compressed(self, op: Op, p: Partition, fut, nbytes: int, gen: int) -> None:
        if op.finished or self.kv.inflight.get(p.key) is not op or gen != self.kv.gen:
            return
        try:
            fut.result()
        except Exception as ex:  # noqa: BLE001
            self.finish(op, f"tensor {op.entry.name!r}: decompressing partition {p.index} failed: {ex!r}")
            return
        self.pulled(op, p, nbytes)

    # ------------------------------------------------------------ average and output --
    def pulled(self, op: Op, p: Partition, nbytes: int) -> None:
        """One partition of ``op`` is in its output (averaged where it could be on arrival)."""
        self.stats["bytes_pulled"] += nbytes
        if self.tracer is not None:
            self.tracer.partition_done(op, p)
        self.kv.done(p)
        op.remaining -= 1
        if op.remaining == 0:
            self.finish(op, None)

    def finish(self, op: Op, error: str | None, exc: type = PushPullError) -> None:
        """The op ends (once): what was not averaged on arrival is, the output goes to the caller's tensor
        or device, and its handle completes at the end of this I/O pass."""
        if op.finished:
            return
        op.finished = True
        e = op.entry
        if op.active:
            op.active = False
            self.active -= 1
            if not self.active:
                self.stats["comm_s"] += time.perf_counter() - self.busy_since
        if error is not None:
            self._unshare_inflight(op)
        self.kv.drop(op, e.parts)
        if error is None and op.out is not None:
            try:
                self.avg.finish(op.out_bytes, e.dtype, op.average, op.counts)
                if op.user_out is not None:
                    op.kind.copy(op.user_out, op.out)
                elif op.device is not None:
                    op.handle.output = op.kind.to_device(op.out, op.device)
            except Exception as ex:  # e.g. a device copy failing
                error = f"tensor {e.name!r}: finishing the output failed: {ex!r}"
        if error is None and e.spec.op == "outer" and self.table.keep_seeds and op.out_bytes is not None:
            try:
                self.table.advance_seed(e, op.sig & ~OUTER_PRESENT_ONLY, op.out_bytes)
            except Exception:  # noqa: BLE001 - a key without a seed fails loudly if its server is lost
                log.exception("tensor %r: its seed could not be kept; it is dropped", e.name)
                self.table.seeds.pop(e.name, None)
        # no table lock: one store is atomic, and only submit() needs its check-and-set guarded
        # (taking it here made the caller's next submit queue behind this thread for the GIL)
        e.busy = False
        if self.tracer is not None:
            self.tracer.op_done(op, error)
        if not self._completed:
            self.van.at_pass_end(self._release_completed)
        self._completed.append((op.handle, error, exc))

    def _unshare_inflight(self, op: Op) -> None:
        """``op`` failed with partitions still at their servers: a push of theirs in shared memory may not have
        been read yet (or be held for the round's sum), and the next op would overwrite it. Those partitions
        send their payloads over the socket from now on, so the round they are in sums what was pushed."""
        inflight = self.kv.inflight
        for p in op.entry.parts:
            if p.shm_push is not None and inflight.get(p.key) is op:
                p.shm_push = None

    def _release_completed(self) -> None:
        done, self._completed = self._completed, []
        for handle, error, exc in done:
            if error is None:
                handle.complete()
            else:
                if exc is not WorkersChanged:  # an elastic job goes on after these
                    self.stats["errors"] += 1
                handle.fail(error, exc)

    # ------------------------------------------------------------ job changes --
    def _started_ops(self) -> list[Op]:
        """Every op past its start: on the wire, or with partitions still waiting in the credit queue (an op
        whose partitions all wait there is on no wire yet, and would otherwise go out after the change)."""
        ops = {id(op): op for op in self.kv.inflight.values()}
        for op, _ in self.kv.queue.queued():
            ops.setdefault(id(op), op)
        return list(ops.values())

    def fail_all(self, reason: str, exc: type = PushPullError) -> None:
        """Every op in flight or waiting for its tensor's set-up fails with ``reason``."""
        for op in self._started_ops():
            self.finish(op, f"tensor {op.entry.name!r}: {reason}", exc)
        for e in self.entries.values():
            waiting, e.waiting = e.waiting, []
            for op in waiting:
                self.finish(op, f"tensor {e.name!r}: {reason}", exc)

    def restart(self, reason: str, moved: dict[int, int], keep_shared: bool = False) -> None:
        """The workers changed (elastic): every op fails with WorkersChanged, the partitions of a lost server
        move (and are declared again by their next op), and every tensor's rounds start again from 1.
        Shared-memory regions are dropped (their slots were the ranks' of before) unless ``keep_shared``: the end
        of a join(), which keeps every rank, as the servers then do."""
        kv = self.kv
        self.changed_reason = reason
        for op in self._started_ops():
            self.finish(op, f"tensor {op.entry.name!r}: {reason}", WorkersChanged)
        kv.inflight.clear()
        for key, server in moved.items():
            ep = kv.parts.get(key)
            if ep is not None:
                e, p = ep
                p.server, p.sock, p.moved = server, f"s{server}", True
                if p.inited:
                    p.inited = False
                    e.pending_inits += 1
                if e.state is READY:
                    e.state = INITING
        for e in self.entries.values():
            waiting, e.waiting = e.waiting, []
            for op in waiting:
                self.finish(op, f"tensor {e.name!r}: {reason}", WorkersChanged)
            e.round = 0
            for p in e.parts:
                p.completed = 0  # the servers number rounds from 1 again too
                if not keep_shared:  # the servers stop sharing memory: slots were the ranks' of before
                    p.shm = p.shm_push = None
            # declarations pending, or moved to another server: declared again by the next op that uses it, not
            # now. Why: the servers wait for every rank's declaration, and a rank that came into the job after this
            # one declared it (or a name, like broadcast's agreement on a size, that the new job no longer uses)
            # would never send one: the declaration would time out and fail the tensor for its next use
            e.declare_later = e.state is INITING
            if e.declare_later and self.table.seeds.get(e.name) is not None and any(p.moved for p in e.parts):
                # a key with a seed (DiLoCo's outer keys, asynchronous training's) that moved off a lost server is
                # declared where it moved now, by every worker holding it. Why: DiLoCo goes on without a restore,
                # so its workers are not at the same point: one that took a round's answer before the change moves
                # on to a round of another key, and would declare this one only after that round, which waits for
                # the workers retrying this one, which wait for its declaration
                e.declare_later = False
                self.send_inits(e, [p for p in e.parts if not p.inited])
