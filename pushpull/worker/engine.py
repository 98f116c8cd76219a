"""The worker engine: moves each tensor's partitions through ASSIGN -> INIT ->
queue -> PUSH -> PULL -> output, entirely on the communication thread.

The caller's thread only validates, registers the request and returns a
:class:`Handle`; all per-tensor state is touched on the I/O thread, so it needs
no locks. Keys come from the scheduler (same on every worker, whatever the call
order); INIT doubles as a per-key barrier and is non-blocking, so workers that
declare tensors in different orders cannot deadlock.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import zmq

from pushpull import dtypes
from pushpull.cluster.assign import part_key
from pushpull.cluster.nodes import worker_identity
from pushpull.cluster.member import Member
from pushpull.config import Config, WorkerIdentity, max_partition_bytes
from pushpull.transport.protocol import (
    Flags, Header, Msg, MsgType, decode_json, dtype_code, encode_json, f32_bits, split_backup_extra,
)
from pushpull.transport.memory import keep_freed_buffers
from pushpull.transport.security import auth_for
from pushpull.transport.van import Van
from pushpull.worker.credit_queue import CreditQueue
from pushpull.worker.direct import DirectPath
from pushpull.worker.handle import Handle, PushPullError, WorkersChanged
from pushpull.worker.window import AutoWindow

log = logging.getLogger(__name__)
FINISH_AFTER_ERROR_S = 2.0  # how long a worker that raised an error waits for the others at shutdown

# the dtypes a push_pull carries, and their names (pushpull.dtypes)
DTYPE_NAME = {t: d.name for t, d in dtypes.torch_table().items() if d.header is not None}
SUPPORTED = set(DTYPE_NAME)


@dataclass(frozen=True)
class KeySpec:
    """What a collective declares about a key. It travels in every worker's INIT and the server
    compares it across workers, so ranks that disagree (about the op, or about ``meta``) all get the
    same error naming each rank's values, instead of a silently wrong result.

    ``op``: what the server does with a round's pushes (``concat``: each rank writes its bytes at its
    offset). ``readers``: the ranks that receive the result (None: all); the others are answered an
    empty body when the round completes, so a slice is routed only where it is needed. ``numel``:
    bytes of a concat key (its pushes are slices). ``meta``: (field, value) pairs that must agree.
    ``writers``: the ranks that push the key (None: all); the local reduce's slices have one per machine
    (:mod:`pushpull.worker.local_reduce`)."""

    kind: str = "allreduce"
    op: str = "sum"
    readers: tuple | None = None
    numel: int = 0
    meta: tuple = ()
    writers: tuple | None = None

    def declaration(self) -> dict:
        d = {"kind": self.kind, "op": self.op, "readers": list(self.readers) if self.readers is not None else None,
             "meta": dict(self.meta) or None}
        if self.writers is not None:
            d["writers"] = list(self.writers)
        return d


PLAIN = KeySpec()

# dtypes NumPy can average in place as they arrive (bfloat16 has no NumPy type)
_NP_FLOAT = {t: dtypes.BY_NAME[n].np_native for t, n in DTYPE_NAME.items()
             if dtypes.BY_NAME[n].floating and dtypes.BY_NAME[n].np_native is not None}
_NP_VIEW = {t for t, n in DTYPE_NAME.items() if dtypes.BY_NAME[n].np_native is not None}


def _describe_spec(spec: KeySpec) -> str:
    text = f"{spec.kind} (op {spec.op}"
    if spec.readers is not None:
        text += f", received by rank(s) {list(spec.readers)}"
    if spec.writers is not None:
        text += f", pushed by rank(s) {list(spec.writers)}"
    for k, v in spec.meta:
        text += f", {k} {v}"
    return text + ")"


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    """A writable uint8 NumPy view of a contiguous CPU tensor's memory (through NumPy when it has
    the dtype: half the cost of torch's reshape and view, paid per tensor per step)."""
    if t.dtype in _NP_VIEW:
        return t.numpy().reshape(-1).view(np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


@dataclass
class Partition:
    index: int
    offset: int        # bytes into the tensor
    nbytes: int
    key: int = 0
    server: int = 0
    inited: bool = False
    codec: object = None  # worker-side compression chain, or None
    held: int = 0         # credit bytes held by the push in flight (returned at PUSH_ACK)
    sock: str = ""        # the van socket of its server
    t_sent: float = 0.0   # when its push left (for the auto window's round trips)
    delivered_at_send: int = 0  # the engine's acknowledged bytes then
    completed: int = 0    # backup workers: the highest round its server said had completed


@dataclass
class Entry:
    """What this worker knows about one named tensor."""

    name: str
    shape: tuple
    dtype: torch.dtype
    compression: dict | None
    parts: list[Partition]
    busy: bool = False
    state: str = "new"      # new -> assigning -> initing -> ready | failed
    error: str | None = None
    round: int = 0
    waiting: list = field(default_factory=list)  # ops queued until the entry is ready
    pending_inits: int = 0
    itemsize: int = 1
    code: int = 0           # wire dtype code
    spec: KeySpec = PLAIN


class Op:
    """One push_pull call in flight (a plain class with slots: one is built per tensor per step)."""

    __slots__ = ("handle", "entry", "inp", "out", "out_bytes", "average", "priority", "round", "remaining",
                 "device", "user_out", "t_submit", "finished", "sig", "reader", "offset", "gen", "counts")

    def __init__(self, handle: Handle, entry: Entry, inp: np.ndarray, out: torch.Tensor | None,
                 out_bytes: np.ndarray | None, average: bool, priority: int, device: torch.device | None = None,
                 user_out: torch.Tensor | None = None, sig: int = 0, reader: bool = True, offset: int = 0):
        self.handle = handle
        self.entry = entry
        self.inp = inp              # raw bytes of the input (contiguous CPU)
        self.out = out              # CPU output tensor
        self.out_bytes = out_bytes
        self.average = average
        self.priority = priority
        self.round = 0
        self.remaining = 0
        self.device = device
        self.user_out = user_out
        self.t_submit = time.perf_counter()
        self.finished = False       # set at once; its handle completes at the end of the I/O pass
        self.sig = sig              # this round's signature, compared across workers by the server (0: none)
        self.reader = reader        # False: this rank only contributes; the server answers it an empty body
        self.offset = offset        # concat keys: where this rank's bytes go in the key
        self.counts = None          # backup workers: [(offset, nbytes, pushes summed)] not yet averaged


class Engine:
    """One per worker process; created by :func:`pushpull.torch.init`."""

    def __init__(self, cfg: Config, ident: WorkerIdentity):
        self.cfg = cfg
        self.ident = ident
        self.rank = ident.rank
        self.size = ident.size
        # averaging multiplies by 1/n, as Horovod's postscale factor: exact for powers of two,
        # within one rounding of x / n otherwise
        self.inv_size = 1.0 / ident.size
        self.van = Van(f"worker{ident.rank}", batch_bytes=cfg.batch_bytes, auth=auth_for(cfg, "worker"))
        self.member = Member(self.van, cfg, {"role": "worker", "rank": ident.rank, "size": ident.size,
                                             "local_rank": ident.local_rank, "local_size": ident.local_size,
                                             "local_reduce": cfg.local_reduce},
                             on_message=self._scheduler_message)
        self.member.on_failure(self._fail_all)
        self.entries: dict[str, Entry] = {}
        self.table_lock = threading.Lock()
        self.ops: dict[int, Op] = {}          # partition key -> op in flight
        self.parts_by_key: dict[int, tuple[Entry, Partition]] = {}
        self.assign_waiting: dict[int, Entry] = {}
        self._req = 0
        # an explicit credit applies at once; 'auto' needs the servers' addresses (known at start)
        self.queue: CreditQueue = CreditQueue((cfg.scheduling_credit or 0) * cfg.partition_bytes)
        self._credit_set = False  # a strategy chose the credit: start() keeps it
        self.window: AutoWindow | None = None  # BYTEPS_SCHEDULING_CREDIT=auto with remote servers, in force
        self._auto_window: AutoWindow | None = None  # kept while a strategy's own credit is in force
        self.delivered = 0  # bytes of pushes acknowledged so far (the auto window's rate samples)
        self.servers_local = True  # every server on this host (loopback): the CPU, not a link, is the limit
        self.num_servers = 0
        self.started = False
        self.stats = {"bytes_pushed": 0, "bytes_pulled": 0, "partitions": 0, "direct_calls": 0, "errors": 0}
        self.direct: DirectPath | None = None  # blocking small calls on the caller's thread
        self.tracer = None  # set by the torch layer when tracing
        self._completed: list[tuple[Handle, str | None, type]] = []  # released at the end of the van's pass
        self.gen = 0  # membership generation (elastic training); +1 at each RESET from the scheduler
        self.changed_unseen = False  # a RESET happened and no WorkersChanged reached the caller since
        self._join_done = threading.Event()  # join(): set when every worker has joined
        self._join_last = -1
        self.changed_reason = ""
        self.first_rank = ident.rank  # the rank this worker registered with: its connections' identity
        self.on_reset: list = []  # fn(rank, size), called on the I/O thread when the workers changed
        self.local = None  # LocalReduce, when this machine's processes reduce together first
        self.local_reason = ""  # why not, when local_size > 1 and it is off
        self.closers: list = []  # fn(), called at stop() before the context ends (sparse tables' sockets)
        # BYTEPS_THREADPOOL_SIZE: compression and decompression off the communication thread, in parallel
        # (their NumPy/torch kernels release the GIL), so that a large compressed model does not serialise
        # behind one thread that also has every socket to serve
        self.pool: ThreadPoolExecutor | None = None  # made at start()

    def _lr(self) -> float:
        """Current learning rate for error feedback (set by DistributedOptimizer)."""
        getter = getattr(self, "lr_getter", None)
        return float(getter()) if getter is not None else 1.0

    # ------------------------------------------------------------ lifecycle --
    def start(self) -> None:
        if self.cfg.keep_freed_buffers:
            keep_freed_buffers()
        if self.cfg.threadpool_size > 0 and self.pool is None:
            self.pool = ThreadPoolExecutor(self.cfg.threadpool_size, thread_name_prefix="pushpull-codec")
        self.van.start()
        book = self.member.register()
        self.num_servers = int(book["num_servers"])
        self.servers_local = all(str(s["host"]).startswith("127.") or s["host"] == "localhost"
                                 for s in book["servers"])
        if not self._credit_set:
            self._use_default_credit()
        # also used to ask a server which ranks a timed-out wait is missing (PUSHPULL_DIRECT_BYTES=0 or not)
        self.direct = DirectPath(self.van.ctx, self.rank,
                                 {f"s{s['rank']}": f"tcp://{s['host']}:{s['port']}" for s in book["servers"]},
                                 auth=self.van.auth,
                                 lanes={f"s{s['rank']}": str(s["lane"]) for s in book["servers"]
                                        if s.get("lane") and self.cfg.direct_lane})
        for s in book["servers"]:
            self.van.connect_dealer(f"s{s['rank']}", f"tcp://{s['host']}:{s['port']}",
                                    worker_identity(self.rank), self._server_message)
        self._start_local_reduce(book)
        self.started = True
        log.info("worker %d/%d connected to %d server(s)", self.rank, self.size, self.num_servers)

    def _start_local_reduce(self, book: dict) -> None:
        """Reduce with this machine's other processes first (pushpull.worker.local_reduce), when every worker
        can: decided from the address book, the same on every worker."""
        from pushpull.transport.security import job_secret
        from pushpull.worker.local_reduce import LocalReduce

        ident = self.ident
        if ident.local_size <= 1:
            return
        args, why = LocalReduce.plan(book, self.rank, ident.local_rank, ident.local_size, self.cfg.local_reduce,
                                     self.servers_local, self.cfg.min_workers, job_secret(self.cfg))
        if args is None:
            self.local_reason = why
            log.info("worker %d: no local reduce (%s): every process pushes whole tensors", self.rank, why)
            return
        self.local = LocalReduce(self, timeout=self.cfg.timeout, **args)

    def shutdown(self) -> None:
        """Leave the job: tell the scheduler, and wait until every worker has (so servers outlive the last
        pull). After an error was raised to the caller the others may be stuck waiting for this worker, so
        it leaves after FINISH_AFTER_ERROR_S instead of waiting PUSHPULL_TIMEOUT for them."""
        if self.started and not self.member.failure:
            self.member.finish(FINISH_AFTER_ERROR_S if self.stats["errors"] else None)
        self.stop()

    def stop(self) -> None:
        """Leave at once, without telling the scheduler (after a crash the launcher stops the job)."""
        if self.local is not None:
            self.local.close()
        for close in self.closers:
            close()
        if self.direct is not None:
            self.direct.close()  # the van's context waits for every socket to be closed
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        self.van.stop()
        self.started = False

    def barrier(self) -> None:
        self.member.barrier("worker")

    def default_credit_bytes(self, partition_bytes: int | None = None) -> int:
        """BYTEPS_SCHEDULING_CREDIT in bytes (0 = unlimited). 'auto': at least one partition per server,
        at least two, when the servers are on other hosts (the window then grows to twice the measured
        bandwidth-delay product: :mod:`pushpull.worker.window`); unlimited when all are on this one.

        Why a window over a network: with every key in flight at once, each worker's kernel holds
        ~1.5 MB spread over one TCP flow per server, the flows progress unevenly, and a key's round
        completes only when its slowest push arrives, so rounds complete late and pulls pile up at the
        end of the step (one 8 MB reduction over 4+4 hosts at 100 Mbit/s: 1.36 M/B, with the window
        1.09 M/B). Why none over loopback: there the CPU is the bottleneck and a window only idles
        it (-7 % on bench allreduce, even at 8 partitions)."""
        part = int(partition_bytes or self.cfg.partition_bytes)
        credit = self.cfg.scheduling_credit
        if credit is None:
            credit = 0 if (self.servers_local or not self.num_servers) else max(2, self.num_servers)
        return credit * part

    def _use_default_credit(self) -> None:
        """On the I/O thread (or before it runs): the configured credit, or the auto window (the same
        one again when a strategy hands the default back, so what it measured is kept)."""
        floor = self.default_credit_bytes()
        self.window = None
        if self.cfg.scheduling_credit is None and floor > 0:
            if self._auto_window is None or self._auto_window.floor != floor:
                self._auto_window = AutoWindow(floor, cap=64 * int(self.cfg.partition_bytes))
            self.window = self._auto_window
        self.queue.credit_bytes = self.window.bytes if self.window is not None else floor

    def set_scheduling(self, partition_bytes: int | None = None, credit_bytes: int | None = None) -> None:
        """Change partition size (tensors first used after this call keep it) and
        credit in bytes (0 = unlimited; applies at once). Strategies call this."""
        if partition_bytes is not None:
            if partition_bytes < 1:
                raise ValueError(f"partition_bytes must be >= 1, got {partition_bytes}")
            if partition_bytes > max_partition_bytes(self.cfg):
                raise ValueError(f"partition_bytes {partition_bytes} does not fit in half of PUSHPULL_MAX_MESSAGE_BYTES="
                                 f"{self.cfg.max_message_bytes} (the largest message a server accepts)")
            self.cfg = self.cfg.replace(partition_bytes=int(partition_bytes))
        if credit_bytes is not None:
            if credit_bytes < 0:
                raise ValueError(f"credit_bytes must be >= 0, got {credit_bytes}")
            # the default (what strategies without their own credit ask for) keeps the auto window
            default = self.started and credit_bytes == self.default_credit_bytes(partition_bytes)
            self._credit_set = not default

            def apply() -> None:
                if default:
                    self._use_default_credit()
                else:
                    self.window = None
                    self.queue.credit_bytes = int(credit_bytes)
                self.queue.admit(self._send_partition)
            self.van.call_soon(apply)

    # ------------------------------------------------------------ caller side --
    def declare(self, name: str, tensor: torch.Tensor, compression: dict | None = None,
                spec: KeySpec = PLAIN) -> Entry:
        with self.table_lock:
            return self._entry(name, tuple(tensor.shape), tensor.dtype, compression, spec)

    def _entry(self, name: str, shape: tuple, dtype: torch.dtype, compression: dict | None,
               spec: KeySpec = PLAIN) -> Entry:
        e = self.entries.get(name)
        if e is not None:
            if e.shape != shape or e.dtype != dtype:
                raise ValueError(f"tensor {name!r} was used as {DTYPE_NAME[e.dtype]}{list(e.shape)} and is now "
                                 f"{DTYPE_NAME[dtype]}{list(shape)}; give different tensors different names")
            if e.spec != spec:
                raise ValueError(f"tensor {name!r} was used as {_describe_spec(e.spec)} and is now "
                                 f"{_describe_spec(spec)}; give different operations different names")
            return e
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        pbytes = max(itemsize, self.cfg.partition_bytes // itemsize * itemsize)
        parts = [Partition(i, off, min(pbytes, nbytes - off)) for i, off in enumerate(range(0, nbytes, pbytes))]
        if compression:
            from pushpull.compression import for_tensor  # min-size and momentum policy: compression/

            try:
                use_compression = for_tensor(compression, nbytes, dtype.is_floating_point, self.cfg.min_compress_bytes)
            except (ValueError, TypeError) as ex:
                raise ValueError(f"tensor {name!r}: bad compression {compression!r}: {ex}") from None
        else:
            use_compression = None
        if spec.op != "sum" and use_compression is not None:
            raise ValueError(f"tensor {name!r}: compression needs a sum on the servers, not {spec.op}")
        e = Entry(name, shape, dtype, use_compression, parts, itemsize=itemsize,
                  code=dtype_code(DTYPE_NAME[dtype]), spec=spec)
        self.entries[name] = e
        return e

    def submit(self, tensor: torch.Tensor, output: torch.Tensor | None, name: str, average: bool,
               priority: int = 0, compression: dict | None = None, spec: KeySpec = PLAIN, sig: int = 0,
               offset: int = 0) -> Handle:
        """Start a push_pull of ``tensor`` into ``output`` (a new tensor if None).

        ``spec``: what the key is (op, readers, ...; :class:`KeySpec`); ``sig``: this round's signature, which
        every worker must send equal (the server fails the round on every rank otherwise); ``offset``: for a
        concat key, the byte offset of this rank's ``tensor`` in the key. A rank that is not among the key's
        readers gets no output (the handle's output is None).

        With the local reduce, sums go through this machine's other processes first (each pushes a slice)."""
        if self.local is not None and self.local.applies(spec):
            self.raise_if_changed(name)
            return self.local.submit(tensor, output, name, average, priority, compression, spec, sig)
        return self._submit_flat(tensor, output, name, average, priority, compression, spec, sig, offset)

    def _submit_flat(self, tensor: torch.Tensor, output: torch.Tensor | None, name: str, average: bool,
                     priority: int = 0, compression: dict | None = None, spec: KeySpec = PLAIN, sig: int = 0,
                     offset: int = 0) -> Handle:
        """:meth:`submit` without the local reduce: this process pushes ``tensor`` itself."""
        if tensor.dtype not in SUPPORTED:
            raise TypeError(f"push_pull of tensor {name!r}: dtype {tensor.dtype} is not supported; "
                            f"use one of {sorted(DTYPE_NAME[d] for d in SUPPORTED)}")
        if self.member.failure:
            raise PushPullError(f"push_pull of tensor {name!r}: {self.member.failure}")
        self.raise_if_changed(name)
        device = tensor.device
        src = tensor.detach()
        if src.device.type != "cpu":
            src = src.to("cpu")
        src = src.contiguous()
        concat = spec.op == "concat"
        if concat:
            if src.dtype != torch.uint8 or not 0 <= offset <= offset + src.numel() <= spec.numel:
                raise ValueError(f"tensor {name!r}: a concat push is uint8 bytes inside the key's {spec.numel} "
                                 f"bytes, got {src.dtype}[{src.numel()}] at offset {offset}")
            shape, dtype = (spec.numel,), torch.uint8
        else:
            shape, dtype = tuple(src.shape), src.dtype
        reader = spec.readers is None or self.rank in spec.readers
        user_out = None
        if not reader:
            out = None
        elif output is None:
            out = torch.empty(shape, dtype=dtype) if concat else torch.empty_like(
                src, memory_format=torch.contiguous_format)
        elif output.device.type == "cpu" and output.is_contiguous():
            out = output
        else:
            out = torch.empty(output.shape, dtype=output.dtype)
            user_out = output
        with self.table_lock:
            try:
                entry = self._entry(name, shape, dtype, compression, spec)
            except ValueError as ex:
                self._abort_next_round(name, str(ex))
                raise
            if entry.error:
                self.stats["errors"] += 1
                raise PushPullError(entry.error)
            if entry.busy:
                raise ValueError(f"a push_pull of tensor {name!r} is already in flight; wait for it before "
                                 f"starting another with the same name")
            entry.busy = True
        inp = _raw_bytes(src)
        if out is None:
            out_bytes = None
        else:
            out_bytes = inp if out.data_ptr() == src.data_ptr() and not concat else _raw_bytes(out)  # in place: one view
        op = Op(Handle(name, None), entry, inp, out, out_bytes, average, priority,
                device=device if device.type != "cpu" and reader else None, user_out=user_out, sig=sig,
                reader=reader, offset=offset)
        op.handle._describe = lambda: self._describe(op)
        op.gen = self.gen
        op.handle.output = output if output is not None else out
        self.van.call_soon(lambda: self._start(op))
        return op.handle

    def _abort_next_round(self, name: str, error: str) -> None:
        """This rank cannot take part in the next round of ``name`` (it changed shape, dtype or op): fail
        that round on every rank with ``error``, instead of leaving the others waiting for its push."""
        e = self.entries.get(name)
        if e is None or e.state != "ready" or e.busy:
            return
        e.state, e.error = "failed", error
        body = encode_json({"error": f"on rank {self.rank}, {error} (so round {e.round + 1} fails on every rank)"})

        def send() -> None:
            e.round += 1
            for p in e.parts:
                self.van.send(p.sock, Header(MsgType.PUSH, sender=self.rank, key=p.key, round=e.round, gen=self.gen,
                                             dtype=e.code, flags=Flags.ABORT), [body])
        self.van.call_soon(send)

    def push_pull_now(self, tensor: torch.Tensor, output: torch.Tensor | None, name: str,
                      average: bool, sig: int = 0, spec: KeySpec = PLAIN) -> torch.Tensor | None:
        """A blocking push_pull done on the caller's thread (:mod:`pushpull.worker.direct`), or None
        where it needs the engine (first use, several partitions, compression, tracing, GPU tensors,
        one already in flight): the caller then submits it as usual."""
        direct = self.direct
        e = self.entries.get(name)
        if (direct is None or direct.closed or self.cfg.direct_bytes <= 0 or e is None or e.state != "ready" or len(e.parts) != 1
                or e.compression is not None or e.parts[0].nbytes > self.cfg.direct_bytes
                or e.spec != spec or spec.op == "concat" or spec.readers is not None
                or self.tracer is not None or tensor.device.type != "cpu" or tensor.dtype != e.dtype
                or tuple(tensor.shape) != e.shape or self.member.failure
                or (output is not None and (output.device.type != "cpu" or not output.is_contiguous()))):
            return None
        with self.table_lock:
            if e.busy or e.state != "ready":
                return None
            e.busy = True
        try:
            self.raise_if_changed(name)
            return self._push_pull_now(e, tensor, output, name, average, sig)
        except WorkersChanged:
            self.changed_unseen = False
            raise
        except PushPullError:
            self.stats["errors"] += 1
            raise
        finally:
            e.busy = False

    def _push_pull_now(self, e: Entry, tensor: torch.Tensor, output: torch.Tensor | None, name: str,
                       average: bool, sig: int = 0) -> torch.Tensor:
        """The exchange itself, with ``e`` marked busy; every way of not getting the sum raises."""
        direct = self.direct
        src = tensor.detach().contiguous()
        out = torch.empty_like(src) if output is None else output
        p = e.parts[0]
        e.round += 1
        header = Header(MsgType.PUSH, sender=self.rank, key=p.key, round=e.round, dtype=e.code, gen=self.gen,
                        numel=p.nbytes // e.itemsize, nbytes=p.nbytes, flags=Flags.PULL | Flags.NO_ACK, req_id=sig)
        gen = self.gen
        try:
            buf = direct.exchange(p.sock, header, _raw_bytes(src), self.cfg.timeout,
                                  lambda: self.member.failure or (None if self.gen == gen else "the workers changed"))
        except TimeoutError:
            raise PushPullError(f"push_pull of tensor {name!r} did not finish within {self.cfg.timeout:.0f}s "
                                f"(PUSHPULL_TIMEOUT): {self.missing_ranks(e, [p], e.round)}") from None
        except ConnectionError as ex:
            if self.gen != gen and not self.member.failure:
                raise WorkersChanged(f"push_pull of tensor {name!r}: the workers changed (generation {self.gen}, "
                                     f"{self.size} workers, this one is rank {self.rank} now)") from None
            raise PushPullError(f"push_pull of tensor {name!r}: {ex}") from None
        except RuntimeError as ex:  # the server's ERROR: the tensor is unusable, as through the engine
            with self.table_lock:
                e.state, e.error = "failed", str(ex)
            raise PushPullError(str(ex)) from None
        except zmq.ZMQError as ex:
            raise PushPullError(f"push_pull of tensor {name!r}: the engine is shut down ({ex})") from None
        error = self._write_sum(e, p, buf, _raw_bytes(out), average)
        if error:
            raise PushPullError(error)
        self._average_rest(out, average)
        self.stats["direct_calls"] += 1
        return out

    def _describe(self, op: Op) -> str:
        """What a timed-out op waits for, with the ranks the servers have not heard from (asked now)."""
        e = op.entry
        if e.state == "initing":
            return self.missing_ranks(e, [p for p in e.parts if not p.inited], op.round)
        if e.state != "ready":
            return f"the tensor is still being set up ({e.state}); is every worker calling push_pull on it?"
        waiting = [p for p in e.parts if self.ops.get(p.key) is op]
        servers = sorted({p.server for p in waiting})
        return (f"{len(waiting)} of {len(e.parts)} partition(s) of round {op.round} outstanding on server(s) "
                f"{servers}; {self.missing_ranks(e, waiting, op.round)}")

    def missing_ranks(self, e: Entry, parts: list, rnd: int, limit: int = 4) -> str:
        """Ask the servers of (up to ``limit`` of) ``parts`` which ranks they have not heard from for round
        ``rnd`` (or for the INIT, while it is pending), and say it; 1 s per server at most."""
        found: dict[str, set] = {}
        for p in parts[:limit]:
            try:
                body = self.direct.exchange(p.sock, Header(MsgType.STATUS, sender=self.rank, key=p.key, round=rnd,
                                                                    gen=self.gen),
                                            None, 1.0, lambda: self.member.failure, want=MsgType.STATUS_RESP)
                d = decode_json(bytes(body))
            except (TimeoutError, ConnectionError, RuntimeError, zmq.ZMQError, ValueError, AttributeError):
                continue
            found.setdefault(d.get("stage", "?"), set()).update(d.get("missing", []))
        if not found:
            return "the servers did not say which ranks are missing; a slow or missing worker keeps the round open"
        return "; ".join(f"rank(s) {sorted(missing)} have not {stage} yet" for stage, missing in found.items())

    # ------------------------------------------------------------ I/O thread --
    def _start(self, op: Op) -> None:
        e = op.entry
        if op.gen != self.gen:  # submitted before a change of the job took effect: it belongs to no round
            self._finish(op, f"tensor {e.name!r}: {self.changed_reason}", WorkersChanged)
            return
        e.round += 1
        op.round = e.round
        if e.state == "failed":
            self._finish(op, e.error)
        elif e.state == "ready":
            self._enqueue(op)
        else:
            e.waiting.append(op)
            if e.state == "new":
                self._send_assign(e)

    def _send_assign(self, e: Entry) -> None:
        e.state = "assigning"
        self._req += 1
        self.assign_waiting[self._req] = e
        self.member.send(Header(MsgType.ASSIGN, req_id=self._req),
                         [encode_json({"name": e.name, "shape": list(e.shape), "dtype": DTYPE_NAME[e.dtype],
                                       "parts": [p.nbytes for p in e.parts],
                                       **({"writers": list(e.spec.writers)} if e.spec.writers is not None else {})})])

    def _on_assigned(self, e: Entry, result: dict) -> None:
        base = int(result["key"])
        for p, server in zip(e.parts, result["servers"]):
            p.key = part_key(base, p.index)
            p.server = int(server)
            p.sock = f"s{p.server}"
            self.parts_by_key[p.key] = (e, p)
        if e.compression:
            from pushpull.worker.codec import WorkerCodec

            itemsize = e.itemsize
            try:
                for p in e.parts:
                    p.codec = WorkerCodec(e.compression, e.dtype, p.nbytes // itemsize, key=p.key,
                                          lr_getter=self._lr)
            except (ValueError, TypeError) as ex:
                self._fail_entry(e, f"tensor {e.name!r}: compression {e.compression} rejected: {ex}")
                return
        e.state = "initing"
        e.pending_inits = len(e.parts)
        if not e.parts:
            self._entry_ready(e)
            return
        self._send_inits(e, e.parts)

    def _send_inits(self, e: Entry, parts: list) -> None:
        body = encode_json({"name": e.name, "compression": e.compression, **e.spec.declaration()})
        itemsize = e.itemsize
        for p in parts:
            self.van.send(p.sock, Header(MsgType.INIT, sender=self.rank, key=p.key, dtype=e.code, gen=self.gen,
                                         numel=p.nbytes // itemsize), [body])

    def _entry_ready(self, e: Entry) -> None:
        e.state = "ready"
        waiting, e.waiting = e.waiting, []
        for op in waiting:
            self._enqueue(op)

    def _fail_entry(self, e: Entry, error: str) -> None:
        e.state = "failed"
        e.error = error
        waiting, e.waiting = e.waiting, []
        for op in waiting:
            self._finish(op, error)
        for op in list(self.ops.values()):
            if op.entry is e:
                self._finish(op, error)

    def _enqueue(self, op: Op) -> None:
        e = op.entry
        op.remaining = len(e.parts)
        if not e.parts:
            self._finish(op, None)
            return
        for p in e.parts:
            self.queue.push((op, p), p.nbytes, op.priority, p.index)
        self.queue.admit(self._send_partition)

    def _send_partition(self, item, nbytes: int) -> None:
        op, p = item
        e = op.entry
        if op.finished:  # the op failed while this partition was queued
            self.queue.release(nbytes)
            return
        if self.tracer is not None:
            self.tracer.admitted(op, p)
        self.ops[p.key] = op
        p.held = nbytes
        if self.window is not None:
            p.t_sent = time.perf_counter()
            p.delivered_at_send = self.delivered
        if e.spec.op == "concat":  # this rank's bytes that fall in the partition, and where they go in it
            lo = max(p.offset, op.offset)
            hi = max(lo, min(p.offset + p.nbytes, op.offset + len(op.inp)))
            view = op.inp[lo - op.offset:hi - op.offset]
            flags = Flags.PULL
            if self.queue.credit_bytes <= 0 and self.tracer is None:
                flags |= Flags.NO_ACK
            self.van.send(p.sock, Header(MsgType.PUSH, sender=self.rank, key=p.key, round=op.round, dtype=e.code,
                                         gen=self.gen, numel=hi - lo, nbytes=hi - lo, flags=flags,
                                         extra=lo - p.offset if hi > lo else 0, req_id=op.sig), [view])
            if self.tracer is not None:
                self.tracer.sent(p)
            self.stats["bytes_pushed"] += hi - lo
            self.stats["partitions"] += 1
            return
        if op.round <= p.completed:  # backup workers: the round completed without us; only its sum is wanted
            self.van.send(p.sock, Header(MsgType.PULL, sender=self.rank, key=p.key, round=op.round, dtype=e.code,
                                         gen=self.gen, numel=p.nbytes // e.itemsize), [])
            self.stats["partitions"] += 1
            return
        view = op.inp[p.offset:p.offset + p.nbytes]
        # one request carries the push and the pull; the PUSH_ACK is wanted only to return a limited
        # credit early or for the trace (half the messages per partition otherwise)
        flags = Flags.PULL
        if self.queue.credit_bytes <= 0 and self.tracer is None:
            flags |= Flags.NO_ACK
        if p.codec is None:
            self._push(op, p, view, flags, 0)
            return
        flags |= Flags.COMPRESSED
        extra = f32_bits(self._lr())  # the server's error feedback rescales by the same lr ratio
        if self.pool is None:
            self._push(op, p, p.codec.compress(view), flags, extra)
            return
        gen = self.gen

        def compressed(fut) -> None:  # on a pool thread: the rest belongs to the I/O thread
            self.van.call_soon(lambda: self._push_compressed(op, p, fut, flags, extra, gen))
        self.pool.submit(p.codec.compress, view).add_done_callback(compressed)

    def _push_compressed(self, op: Op, p: Partition, fut, flags: int, extra: int, gen: int) -> None:
        """A partition compressed on the pool (BYTEPS_THREADPOOL_SIZE): send it, unless its op ended meanwhile
        (its credit went back then) or the workers changed (its round no longer exists)."""
        if op.finished or self.ops.get(p.key) is not op or gen != self.gen:
            return
        try:
            frame = fut.result()
        except Exception as ex:  # noqa: BLE001 - the op fails with the codec's error, as inline
            self._finish(op, f"tensor {op.entry.name!r}: compressing partition {p.index} failed: {ex!r}")
            return
        if self.window is not None:  # the window's round trip starts at the send, not before compressing
            p.t_sent = time.perf_counter()
        self._push(op, p, frame, flags, extra)

    def _push(self, op: Op, p: Partition, frame, flags: int, extra: int) -> None:
        e = op.entry
        if flags & Flags.COMPRESSED:
            nb = len(memoryview(frame).cast("B")) if not isinstance(frame, (bytes, bytearray)) else len(frame)
        else:
            nb = p.nbytes
        self.van.send(p.sock, Header(MsgType.PUSH, sender=self.rank, key=p.key, round=op.round, dtype=e.code, gen=self.gen,
                                     numel=p.nbytes // e.itemsize, nbytes=nb, flags=flags, extra=extra, req_id=op.sig),
                      [frame])
        if self.tracer is not None:
            self.tracer.sent(p)
        self.stats["bytes_pushed"] += nb
        self.stats["partitions"] += 1

    def _decompress(self, op: Op, p: Partition, buf, _keepalive=None) -> None:
        """A compressed sum into the output (averaging floats on the way); ``_keepalive``: the message that
        owns ``buf`` while a pool thread reads it."""
        dst = op.out_bytes[p.offset:p.offset + p.nbytes]
        p.codec.decompress_into(buf, dst)
        npdt = _NP_FLOAT.get(op.entry.dtype) if op.average and self.size > 1 else None
        if npdt is not None:
            typed = dst.view(npdt)
            np.multiply(typed, self.inv_size, out=typed)

    def _pulled_compressed(self, op: Op, p: Partition, fut, nbytes: int, gen: int) -> None:
        if op.finished or self.ops.get(p.key) is not op or gen != self.gen:
            return
        try:
            fut.result()
        except Exception as ex:  # noqa: BLE001
            self._finish(op, f"tensor {op.entry.name!r}: decompressing partition {p.index} failed: {ex!r}")
            return
        self._partition_pulled(op, p, nbytes)

    def _partition_pulled(self, op: Op, p: Partition, nbytes: int) -> None:
        self.stats["bytes_pulled"] += nbytes
        if self.tracer is not None:
            self.tracer.partition_done(op, p)
        del self.ops[p.key]
        if p.held:
            self.queue.release(p.held)
            p.held = 0
        op.remaining -= 1
        if op.remaining == 0:
            self._finish(op, None)

    def _server_message(self, msg: Msg) -> None:
        """A failure while handling a server's answer fails that tensor's op at once,
        with the cause, instead of leaving it to time out."""
        try:
            self._handle_server_message(msg)
        except Exception as ex:
            log.exception("handling %s for key %d failed", msg.header.type.name, msg.header.key)
            op = self.ops.get(msg.header.key)
            if op is not None:
                self._finish(op, f"tensor {op.entry.name!r}: handling the server's "
                                 f"{msg.header.type.name} failed: {ex!r}")

    def _handle_server_message(self, msg: Msg) -> None:
        h = msg.header
        if h.gen != self.gen:  # an answer from before the workers changed (elastic): its op already failed
            return
        t = h.type
        if t == MsgType.INIT_ACK:
            ep = self.parts_by_key.get(h.key)
            if ep is None:
                return
            e, p = ep
            if not p.inited:
                p.inited = True
                e.pending_inits -= 1
                if e.pending_inits == 0 and e.state == "initing":
                    self._entry_ready(e)
        elif t == MsgType.PUSH_ACK:
            if self.tracer is not None:
                self.tracer.push_acked(h.key, h.round)
            # credit covers the push only (as BytePS): holding it until the pull, which waits for
            # the other workers, deadlocks when workers admit partitions in different orders
            op = self.ops.get(h.key)
            ep = self.parts_by_key.get(h.key)
            if op is not None and ep is not None and op.round == h.round and ep[1].held:
                p = ep[1]
                if self.window is not None and p.t_sent:
                    self.delivered += p.nbytes
                    self.queue.credit_bytes = self.window.on_ack(self.delivered - p.delivered_at_send,
                                                                 time.perf_counter() - p.t_sent)
                self.queue.release(p.held)
                p.held = 0
                self.queue.admit(self._send_partition)
        elif t == MsgType.PULL_RESP:
            op = self.ops.get(h.key)
            ep = self.parts_by_key.get(h.key)
            if op is None or ep is None or op.round != h.round:
                log.warning("unexpected PULL_RESP for key %d round %d dropped", h.key, h.round)
                return
            _, p = ep
            if self.tracer is not None:
                self.tracer.pull_received(h.key)
            buf = msg.body_view()
            inv = self.inv_size
            if h.extra:  # backup workers: the sum holds ``count`` pushes; ``ahead`` rounds completed since
                count, ahead = split_backup_extra(h.extra)
                p.completed = max(p.completed, h.round + ahead)
                if count and op.average:
                    inv = 1.0 / count
                    if op.entry.dtype not in _NP_FLOAT:  # averaged at the end, per partition
                        op.counts = (op.counts or []) + [(p.offset, p.nbytes, count)]
            if not op.reader:  # this rank only contributed: the answer says the round completed
                pass
            elif h.flags & Flags.COMPRESSED:
                if self.pool is not None:  # decompress on the pool; the partition completes when it is done
                    gen = self.gen

                    def decompressed(fut) -> None:
                        self.van.call_soon(lambda: self._pulled_compressed(op, p, fut, len(buf), gen))
                    self.pool.submit(self._decompress, op, p, buf, msg).add_done_callback(decompressed)
                    return
                self._decompress(op, p, buf)
            else:
                error = self._write_sum(op.entry, p, buf, op.out_bytes[p.offset:p.offset + p.nbytes], op.average,
                                        inv)
                if error:
                    self._finish(op, error)
                    return
            self._partition_pulled(op, p, len(buf))
            if self.queue:
                self.queue.admit(self._send_partition)
        elif t == MsgType.ERROR:
            text = decode_json(msg.body()).get("error", "unknown server error")
            ep = self.parts_by_key.get(h.key)
            if ep is None:
                log.error("server error: %s", text)
                return
            self._fail_entry(ep[0], text)
        else:
            log.warning("unexpected %s from a server ignored", t.name)

    def late_pushes(self) -> dict[int, int]:
        """Backup workers: pushes the servers dropped because their round had completed, per rank, over every
        partition of every backup key (asked through STATUS, 1 s per partition at most; ``partitions`` counts
        those that answered)."""
        total: dict[int, int] = {}
        for e in list(self.entries.values()):
            if not any(k == "backup_workers" for k, _ in e.spec.meta):
                continue
            for p in e.parts:
                try:
                    body = self.direct.exchange(p.sock, Header(MsgType.STATUS, sender=self.rank, key=p.key,
                                                               round=e.round, gen=self.gen),
                                                None, 1.0, lambda: self.member.failure, want=MsgType.STATUS_RESP)
                    dropped = decode_json(bytes(body)).get("dropped") or {}
                except (TimeoutError, ConnectionError, RuntimeError, zmq.ZMQError, ValueError) as ex:
                    raise PushPullError(f"tensor {e.name!r}: server {p.server} did not say its late pushes: "
                                        f"{ex}") from None
                for rank, count in dropped.items():
                    total[int(rank)] = total.get(int(rank), 0) + int(count)
        return total

    def rounds_behind(self) -> int:
        """Backup workers: how many rounds of every backup key have completed on the servers beyond this
        worker's own (as of their last answers): rounds it can catch up on by pulling their sums."""
        behind = None
        for e in list(self.entries.values()):
            if e.busy or not e.parts or not any(k == "backup_workers" for k, _ in e.spec.meta):
                continue
            ahead = min(p.completed for p in e.parts) - e.round
            behind = ahead if behind is None else min(behind, ahead)
        return max(0, behind or 0)

    def _write_sum(self, e: Entry, p: Partition, buf, dst: np.ndarray, average: bool,
                   inv: float | None = None) -> str | None:
        """Copy a partition's sum from the server into ``dst`` (averaging floats on the way, times ``inv``:
        1/size, or 1/pushes summed with backup workers); an error text when the server's answer does not fit."""
        if len(buf) != p.nbytes:
            return f"tensor {e.name!r}: server {p.server} answered {len(buf)} bytes for a partition of {p.nbytes}"
        npdt = _NP_FLOAT.get(e.dtype) if average and self.size > 1 else None
        if npdt is not None:  # average while copying: one pass over the data instead of two
            np.multiply(np.frombuffer(buf, dtype=npdt), self.inv_size if inv is None else inv, out=dst.view(npdt))
        else:
            np.copyto(dst, np.frombuffer(buf, dtype=np.uint8))
        return None

    def _scheduler_message(self, msg: Msg) -> None:
        h = msg.header
        if h.type == MsgType.ASSIGN_ACK:
            e = self.assign_waiting.pop(h.req_id, None)
            if e is not None:
                self._on_assigned(e, decode_json(msg.body()))
        elif h.type == MsgType.ERROR:
            d = decode_json(msg.body())
            name = d.get("tensor")
            e = self.entries.get(name) if name else None
            if e is not None:
                self.assign_waiting = {k: v for k, v in self.assign_waiting.items() if v is not e}
                self._fail_entry(e, d.get("error", "error"))
            elif name:  # not declared here yet: the scheduler repeats it when this worker does
                log.info("scheduler error for a tensor not declared here yet: %s", d.get("error"))
            else:
                log.error("scheduler error: %s", d.get("error"))
        elif h.type == MsgType.RESET:
            self._reset(decode_json(msg.body()))
        elif h.type == MsgType.TERMINATE:
            pass
        else:
            log.warning("unexpected %s from the scheduler ignored", h.type.name)

    def join(self) -> int:
        """Horovod's join(): this worker ran out of data. Until every worker has joined, the servers complete
        the others' rounds without it (it contributes nothing, as if it pushed zeros to a sum); then every
        worker's rounds start again and all are released with the rank that joined last. Waits as long as the
        others train, checking that the cluster is alive."""
        if self.local is not None:
            raise PushPullError(f"join() is not available with the local reduce (BYTEPS_LOCAL_SIZE="
                                f"{self.ident.local_size}): a machine's processes reduce each tensor together; set "
                                f"PUSHPULL_LOCAL_REDUCE=0 to use join()")
        self._join_done.clear()
        while self.ops or self.queue:  # its own reductions first: a push after JOIN would come too late
            if self.member.failure:
                raise PushPullError(f"join(): {self.member.failure}")
            time.sleep(0.005)
        self.member.send(Header(MsgType.JOIN, key=self.rank))
        while not self._join_done.wait(0.25):
            if self.member.failure:
                raise PushPullError(f"join(): {self.member.failure}")
        return self._join_last

    def _reset(self, d: dict) -> None:
        """The workers changed (elastic; servers have applied it already): take the new rank and size, fail
        every op in flight with WorkersChanged (the caller restores its last commit and goes on), and start
        every tensor's rounds again from 1; declarations still pending are sent again."""
        new_rank = d["ranks"].get(str(self.first_rank))
        if new_rank is None:
            self.member.fail(f"this worker was dropped from the job ({d.get('lost')})")
            return
        self.gen = int(d["gen"])
        self.rank, self.size = int(new_rank), int(d["num_workers"])
        self.inv_size = 1.0 / self.size
        self.member.node_id = self.rank
        reason = (f"the job changed ({d.get('lost')}): {self.size} workers, this one is rank {self.rank} now "
                  f"(generation {self.gen})")
        (log.info if "joined_last" in d else log.warning)("%s", reason)
        self.changed_reason, self.changed_unseen = reason, True
        for op in list(self.ops.values()):
            self._finish(op, f"tensor {op.entry.name!r}: {reason}", WorkersChanged)
        self.ops.clear()
        moved = {int(k): int(v) for k, v in d.get("moved", {}).items()}  # a lost server's partitions
        for key, server in moved.items():
            ep = self.parts_by_key.get(key)
            if ep is not None:
                e, p = ep
                p.server, p.sock = server, f"s{server}"
                if p.inited:
                    p.inited = False
                    e.pending_inits += 1
                if e.state == "ready":
                    e.state = "initing"
        for e in self.entries.values():
            waiting, e.waiting = e.waiting, []
            for op in waiting:
                self._finish(op, f"tensor {e.name!r}: {reason}", WorkersChanged)
            e.round = 0
            for p in e.parts:
                p.completed = 0  # the servers number rounds from 1 again too
            if e.state == "initing":  # declarations pending, or moved to another server: declare again
                self._send_inits(e, [p for p in e.parts if not p.inited])
        if "joined_last" in d:  # the end of a join(), not a change of workers: nothing to restore
            self.changed_unseen = False
            self._join_last = int(d["joined_last"])
            self._join_done.set()
            return
        for fn in self.on_reset:
            fn(self.rank, self.size)

    def _finish(self, op: Op, error: str | None, exc: type = PushPullError) -> None:
        if op.finished:
            return
        op.finished = True
        e = op.entry
        for p in e.parts:
            if self.ops.get(p.key) is op:
                del self.ops[p.key]
                if p.held:
                    self.queue.release(p.held)
                    p.held = 0
        if error is None and op.out is not None:
            try:
                self._average_rest(op.out, op.average, op.counts)
                if op.user_out is not None:
                    op.user_out.copy_(op.out)
                elif op.device is not None:
                    op.handle.output = op.out.to(op.device)
            except Exception as ex:  # e.g. a device copy failing
                error = f"tensor {e.name!r}: finishing the output failed: {ex!r}"
        # no table_lock: one store is atomic, and only submit() needs its check-and-set guarded
        # (taking it here made the caller's next submit queue behind this thread for the GIL)
        e.busy = False
        if self.tracer is not None:
            self.tracer.op_done(op, error)
        if not self._completed:
            self.van.at_pass_end(self._release_completed)
        self._completed.append((op.handle, error, exc))

    def _average_rest(self, out: torch.Tensor, average: bool, counts: list | None = None) -> None:
        """Average what was not averaged on arrival (dtypes NumPy cannot scale in place); integers are
        divided rounding toward zero, as C integer division. ``counts``: backup workers' partitions, each
        divided by the pushes its sum holds."""
        if counts:
            flat = out.reshape(-1).view(torch.uint8)
            for off, nbytes, count in counts:
                part = flat[off:off + nbytes].view(out.dtype)
                if out.dtype.is_floating_point:
                    part.div_(count)
                else:
                    part.copy_(torch.div(part, count, rounding_mode="trunc"))
            return
        if average and self.size > 1 and out.dtype not in _NP_FLOAT:
            if out.dtype.is_floating_point:
                out.div_(self.size)
            else:
                out.copy_(torch.div(out, self.size, rounding_mode="trunc"))

    def _release_completed(self) -> None:
        done, self._completed = self._completed, []
        for handle, error, exc in done:
            if error is None:
                handle.complete()
            else:
                if exc is not WorkersChanged:  # an elastic job goes on after these
                    self.stats["errors"] += 1
                handle.fail(error, exc)

    def _fail_all(self, reason: str) -> None:
        def fail() -> None:
            for op in list(self.ops.values()):
                self._finish(op, f"tensor {op.entry.name!r}: {reason}")
            for e in self.entries.values():
                for op in e.waiting:
                    self._finish(op, f"tensor {e.name!r}: {reason}")
                e.waiting = []
        self.van.call_soon(fail)

    def wait(self, handle: Handle, timeout: float | None = None):
        """Block until ``handle`` completes; a dead cluster or a timeout raises."""
        try:
            failure = (lambda: self.member.failure) if self.local is None else self.local.failure_text
            return handle.wait_alive(timeout or self.cfg.timeout, failure)
        except WorkersChanged:
            self.changed_unseen = False  # the caller knows now: its next operations belong to the new job
            raise

    def raise_if_changed(self, name: str) -> None:
        """The first operation after a change of the job raises WorkersChanged on a worker that had nothing
        in flight when it happened: it must restore and sync with the others before going on."""
        if self.changed_unseen:
            self.changed_unseen = False
            raise WorkersChanged(f"tensor {name!r}: {self.changed_reason}")
