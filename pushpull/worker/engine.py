"""The worker engine: the public face of one worker process's communication, in three layers.

    Engine      (this module)  lifecycle, membership, the caller's thread: validate, register an op,
                               return a handle; the direct path's entry; join and elastic changes
    Pipeline    (pipeline.py)  a tensor's named stages on the I/O thread: partition -> set up (ASSIGN,
                               INIT) -> queue -> compress -> push/pull -> decompress -> average -> output
    KVClient    (kv_client.py) keys only: request ids, INIT/PUSH/PULL, credit at PUSH_ACK, answers
                               routed by message type through one table

with the records they share in table.py and the averaging in average.py. Keys come from the scheduler
(same on every worker, whatever the call order); INIT doubles as a per-key barrier and is non-blocking,
so workers that declare tensors in different orders cannot deadlock.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from pushpull.cluster.address import server_address
from pushpull.dtypes import BY_NAME, DType
from pushpull import metrics
from pushpull.cluster.nodes import worker_identity
from pushpull.cluster.member import Member
from pushpull.config import (
    LANE_MIN_PARTITION_BYTES, Config, WorkerIdentity, data_lane_on, max_partition_bytes,
)
from pushpull.transport import shm
from pushpull.transport.protocol import Header, MsgType, encode_json
from pushpull.transport.memory import keep_freed_buffers
from pushpull.transport.security import auth_for
from pushpull.transport.van import Van
from pushpull.worker.average import Averager
from pushpull.worker.direct import DirectPath
from pushpull.worker.direct_call import DirectCalls
from pushpull.worker.handle import Handle, PushPullError, WorkersChanged
from pushpull.worker.kv_client import KVClient
from pushpull.worker.pipeline import Pipeline
from pushpull.worker.table import (  # noqa: F401 - KeySpec, PLAIN, SUPPORTED: the API's names
    FAILED, PLAIN, READY, SUPPORTED, Entry, KeySpec, Op, TensorTable, new_stats,
)
from pushpull.worker.status import StatusQueries
from pushpull.worker.tensors import kind_of
from pushpull.worker.window import AutoWindow

log = logging.getLogger(__name__)
UINT8 = BY_NAME["uint8"]  # a concat key's bytes
KEYS_PER_SERVER = 16  # a default key is at most the model's gradient bytes / (this x servers): fit_default_keys
FINISH_AFTER_ERROR_S = 2.0  # how long a worker that raised an error waits for the others at shutdown


class Engine:
    """One per worker process; created by :func:`pushpull.torch.init`."""

    def __init__(self, cfg: Config, ident: WorkerIdentity):
        self.cfg = cfg
        self.ident = ident
        self.van = Van(f"worker{ident.rank}", batch_bytes=cfg.batch_bytes, auth=auth_for(cfg, "worker"))
        self.member = Member(self.van, cfg, {"role": "worker", "rank": ident.rank, "size": ident.size,
                                             "local_rank": ident.local_rank, "local_size": ident.local_size,
                                             "local_reduce": cfg.local_reduce},
                             on_message=self._scheduler_message)
        self.member.on_failure(self._fail_all)
        self.table = TensorTable()
        self.stats = new_stats()
        self.averager = Averager(ident.size)
        self.pipeline = Pipeline(self.table, self.averager, self.stats, on_reset=self._reset)
        self.pipeline.max_message_bytes = cfg.max_message_bytes
        self.table.keep_seeds = bool(cfg.min_workers)  # a server can be lost only in an elastic job
        # an explicit credit applies at once; 'auto' needs the servers' addresses (known at start)
        self.kv = KVClient(self.van, self.member, ident.rank, self.pipeline,
                           (cfg.scheduling_credit or 0) * cfg.partition_bytes)
        self.pipeline.bind(self.kv)
        self.kv.scheduler_handlers[MsgType.JOINED] = lambda msg: self.joined_ranks.add(int(msg.header.key))
        self._credit_set = False  # a strategy chose the credit: start() keeps it
        self._auto_window: AutoWindow | None = None  # kept while a strategy's own credit is in force
        self._layerwise = False  # layer-wise updates: the next forward waits for the first layers first
        self.servers_local = True  # every server on this host (loopback): the CPU, not a link, is the limit
        self.server_addrs: dict[str, str] = {}  # socket name -> the address its server is reached at
        self.num_servers = 0
        self.started = False
        self.direct: DirectPath | None = None  # blocking small calls on the caller's thread
        self.direct_calls = DirectCalls(self)  # when a blocking call may take it, and what it does with the answer
        self.status = StatusQueries(self)  # what the servers say of this worker's tensors
        self.changed_unseen = False  # a RESET happened and no WorkersChanged reached the caller since
        self._join_done = threading.Event()  # join(): set when every worker has joined, or the cluster failed
        self.member.on_failure(lambda _reason: self._join_done.set())  # a waiter in join() hears of it at once
        self._join_last = -1
        self.joined_ranks: set[int] = set()  # ranks in join() now (the scheduler's JOINED), for join()'s error
        self.first_rank = ident.rank  # the rank this worker registered with: its connections' identity
        self.joined_late = False  # registered after its elastic job had started (a replacement)
        self.arrival_gen = 0  # the last generation that brought a worker into the running job (elastic)
        self.servers_lost: set[int] = set()  # servers the job went on without (elastic)
        self.member.recover_state = self._recover_state  # a lost scheduler's replacement asks where the job stands
        self.member.on_recovered(lambda: self.kv.assign_again())
        self.on_reset: list = []  # fn(rank, size), called on the I/O thread when the workers changed
        self.local = None  # LocalReduce, when this machine's processes reduce together first
        self.local_reason = ""  # why not, when local_size > 1 and it is off
        self.data_lanes: dict[str, str] = {}  # server socket -> "sealed" / "plain": its pushes and pulls go by lane
        self.closers: list = []  # fn(), called at stop() before the context ends (sparse tables' sockets)
        self.metrics = None  # the Prometheus endpoint (PUSHPULL_METRICS_PORT)
        self.tensorboard = None  # PUSHPULL_TENSORBOARD_DIR's writer

    # ------------------------------------------------------------ who this worker is now --
    rank = property(lambda self: self.kv.rank, doc="this worker's rank (changes when the workers change)")
    gen = property(lambda self: self.kv.gen, doc="membership generation (elastic training): +1 at each RESET")
    size = property(lambda self: self.averager.size, doc="the number of workers")
    window = property(lambda self: self.kv.window,
                      doc="BYTEPS_SCHEDULING_CREDIT=auto with remote servers, while in force")
    changed_reason = property(lambda self: self.pipeline.changed_reason, doc="what the last change of the job was")
    tracer = property(lambda self: self.pipeline.tracer, doc="the timeline while a traced step runs (set_tracer)")
    pool = property(lambda self: self.pipeline.pool,
                    doc="BYTEPS_THREADPOOL_SIZE's codec threads (made at start)")

    # ------------------------------------------------------------ collaborators --
    def set_tracer(self, tracer) -> None:
        """The timeline (:mod:`pushpull.worker.trace`) records this engine's ops while ``tracer`` is set (called
        from the training thread). The client asks for PUSH_ACKs whenever the pipeline records, so it learns
        of the tracer first and forgets it last (an ack nobody records is harmless)."""
        if tracer is not None:
            self.kv.trace_ack = tracer.push_acked
            self.pipeline.tracer = tracer
        else:
            self.pipeline.tracer = None
            self.kv.trace_ack = None

    def set_lr_getter(self, getter: Callable[[], float] | None) -> None:
        """The optimizer's learning rate, read by error feedback (DistributedOptimizer hands it in)."""
        self.pipeline.lr = getter

    # ------------------------------------------------------------ lifecycle --
    def start(self) -> None:
        if self.cfg.keep_freed_buffers:
            keep_freed_buffers()
        # BYTEPS_THREADPOOL_SIZE: compression and decompression off the communication thread, in parallel
        # (their NumPy/torch kernels release the GIL), so that a large compressed model does not serialise
        # behind one thread that also has every socket to serve
        if self.cfg.threadpool_size > 0 and self.pipeline.pool is None:
            self.pipeline.pool = ThreadPoolExecutor(self.cfg.threadpool_size, thread_name_prefix="pushpull-codec")
        self.van.start()
        book = self.member.register()
        if int(book["node_id"]) != self.first_rank or int(book.get("gen", 0)):
            # a late worker of an elastic job: the job's rank, size and generation are its own from now on (its
            # connections keep the identity of the rank it registered with, which the servers map)
            self.kv.gen = int(book.get("gen", 0))
            self.kv.rank = int(book["node_id"])
            self.averager.resize(int(book["num_workers"]))
            self.joined_late = True
            log.warning("worker joined the running job as rank %d of %d (generation %d)", self.rank, self.size,
                        self.gen)
        self.num_servers = int(book["num_servers"])
        self.servers_local = all(str(s["host"]).startswith("127.") or s["host"] == "localhost"
                                 for s in book["servers"])
        if not self._credit_set:
            self._use_default_credit()
        # also used to ask a server which ranks a timed-out wait is missing (PUSHPULL_DIRECT_BYTES=0 or not)
        self.direct = DirectPath(self.van.ctx, self.first_rank,
                                 {f"s{s['rank']}": f"tcp://{s['host']}:{s['port']}" for s in book["servers"]},
                                 auth=self.van.auth,
                                 lanes={f"s{s['rank']}": str(s["lane"]) for s in book["servers"]
                                        if s.get("lane") and self.cfg.direct_lane})
        # a server on this host's loopback may offer a Unix socket (PUSHPULL_LOCAL_IPC; Van.bind_ipc)
        self.server_addrs = {f"s{s['rank']}": server_address(s, self.cfg.local_ipc) for s in book["servers"]}
        for s in book["servers"]:
            self.van.connect_dealer(f"s{s['rank']}", self.server_addrs[f"s{s['rank']}"],
                                    worker_identity(self.first_rank), self.kv.on_server_message,
                                    host=str(s["host"]))
        self._open_data_lanes(book)
        # servers reached over their Unix socket share a host, so may share memory too (pushpull.transport.shm);
        # not with elastic training, which renumbers ranks and so a region's slots
        if self.cfg.local_shm and not self.cfg.min_workers and shm.available():
            self.kv.shm_socks = {sock for sock, addr in self.server_addrs.items() if addr.startswith("ipc://")}
            # a one-partition tensor the direct path may carry keeps its payload on the socket
            self.kv.shm_min_bytes = max(shm.MIN_KEY_BYTES, self.cfg.direct_bytes)
        self.kv.num_workers = self.size
        self._start_local_reduce(book)
        self.started = True
        log.info("worker %d/%d connected to %d server(s)", self.rank, self.size, self.num_servers)
        if self.cfg.metrics_port:
            self.metrics = metrics.start("worker", self.cfg.metrics_port + self.first_rank, self.cfg.metrics_host,
                                         self.metrics_samples, {"role": "worker", "first_rank": self.first_rank})
        if self.cfg.tensorboard_dir:
            self.tensorboard = metrics.start_tensorboard(
                os.path.join(self.cfg.tensorboard_dir, f"worker{self.first_rank}"),
                lambda: {**self.stats, "workers": self.size, "generation": self.gen})

    def metrics_samples(self) -> list:
        """PUSHPULL_METRICS_PORT's figures of this worker (pushpull.metrics), read when Prometheus scrapes."""
        st = self.stats
        comm, wait = st["comm_s"] + st["direct_s"], st["wait_s"] + st["direct_s"]
        return [("pushpull_bytes_pushed_total", "counter", "payload bytes pushed to the servers", st["bytes_pushed"]),
                ("pushpull_compression_ratio", "gauge", "bytes before compression / bytes pushed (1: none)",
                 st["bytes_pushed_raw"] / st["bytes_pushed"] if st["bytes_pushed"] else 1.0),
                ("pushpull_comm_seconds_total", "counter", "time with some reduction in flight", comm),
                ("pushpull_wait_seconds_total", "counter", "time the training thread waited for reductions", wait),
                ("pushpull_overlap_seconds_total", "counter", "communication hidden behind computation "
                 "(comm - wait)", max(0.0, comm - wait)),
                ("pushpull_bytes_pulled_total", "counter", "payload bytes pulled from the servers", st["bytes_pulled"]),
                ("pushpull_partitions_total", "counter", "partitions pushed and pulled", st["partitions"]),
                ("pushpull_errors_total", "counter", "operations that failed", st["errors"]),
                ("pushpull_ops_in_flight", "gauge", "partitions on the wire now", len(self.kv.inflight)),
                ("pushpull_rank", "gauge", "this worker's rank now (elastic training renumbers)", self.rank),
                ("pushpull_workers", "gauge", "the job's workers now", self.size),
                ("pushpull_generation", "gauge", "changes of the job's workers so far (elastic)", self.gen),
                *metrics.STEPS.samples()]

    def _open_data_lanes(self, book: dict) -> None:
        """Carry the pushes and pulls to each server reached over TCP through a lane (PUSHPULL_DATA_LANE;
        pushpull.transport.lane), opened here before this worker sends that server anything, so that no
        message of ours can overtake another on the other path. Why: libzmq's I/O thread adds its own hand-offs
        to every message, and between machines CURVE copies every byte twice more to encrypt it; a lane reads a
        large message straight into its own buffer and seals each frame once with AES-GCM
        (pushpull.transport.seal). A lane that cannot be opened leaves that server on the DEALER, with a
        warning. PUSHPULL_DATA_LANE=auto: only for keys of at least LANE_MIN_PARTITION_BYTES (pushpull.config)."""
        if not data_lane_on(self.cfg):
            return
        from pushpull.transport.lane import LaneClient, lane_key, lane_sealed

        for s in book["servers"]:
            sock = f"s{s['rank']}"
            if not s.get("lane") or not self.server_addrs[sock].startswith("tcp://"):
                continue  # no lane offered, or an ipc socket (and its shared memory) on this host
            try:
                client = LaneClient(str(s["lane"]), worker_identity(self.first_rank), lane_key(self.van.auth),
                                    min(self.cfg.register_timeout, self.cfg.timeout),
                                    max_message=self.cfg.max_message_bytes,
                                    alive=lambda: self.member.failure,
                                    sealed=lane_sealed(self.van.auth, str(s["host"])))
            except OSError as e:
                if self.member.failure:
                    raise ConnectionError(self.member.failure) from None
                log.warning("worker %d: no lane to server %s at %s (%s); its pushes and pulls go over ZeroMQ",
                            self.rank, s["rank"], s["lane"], e)
                continue
            self.van.adopt_lane(sock, client.detach())
            self.data_lanes[sock] = "sealed" if client.session is not None else "plain"

    def _start_local_reduce(self, book: dict) -> None:
        """Reduce with this machine's other processes first (pushpull.worker.local_reduce), when every worker
        can: decided from the address book, the same on every worker."""
        from pushpull.transport.security import job_secret

        ident = self.ident
        if ident.local_size <= 1:
            return
        try:
            from pushpull.worker.local_reduce import LocalReduce  # sums in torch: torch tensors only
        except ImportError as ex:
            self.local_reason = f"the local reduce needs torch ({ex})"
            log.info("worker %d: no local reduce (%s): every process pushes whole tensors", self.rank,
                     self.local_reason)
            return
        args, why = LocalReduce.plan(book, self.rank, ident.local_rank, ident.local_size, self.cfg.local_reduce,
                                     self.servers_local, self.cfg.min_workers, job_secret(self.cfg))
        if args is None:
            self.local_reason = why
            log.info("worker %d: no local reduce (%s): every process pushes whole tensors", self.rank, why)
            return
        self.local = LocalReduce(self.submit_flat, lambda: self.member.failure, self.stats, timeout=self.cfg.timeout,
                                 **args)

    def shutdown(self) -> None:
        """Leave the job: tell the scheduler, and wait until every worker has (so servers outlive the last
        pull). After an error was raised to the caller the others may be stuck waiting for this worker, so
        it leaves after FINISH_AFTER_ERROR_S instead of waiting PUSHPULL_TIMEOUT for them."""
        if self.started and not self.member.failure:
            self.member.finish(FINISH_AFTER_ERROR_S if self.stats["errors"] else None)
        self.stop()

    def stop(self) -> None:
        """Leave at once, without telling the scheduler (after a crash the launcher stops the job)."""
        metrics.stop(self.metrics)
        self.metrics = None
        metrics.stop_tensorboard(self.tensorboard)
        self.tensorboard = None
        if self.local is not None:
            self.local.close()
        for close in self.closers:
            close()
        if self.direct is not None:
            self.direct.close()  # the van's context waits for every socket to be closed
        if self.pipeline.pool is not None:
            self.pipeline.pool.shutdown(wait=False, cancel_futures=True)
            self.pipeline.pool = None
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
        self.kv.window = None
        # BytePS orders by priority only where scheduling was asked for (a credit set by hand); the auto
        # window only paces, so it keeps each worker's pushes in ready order, the same on every worker
        self.kv.queue.by_priority = self.cfg.scheduling_credit is not None or self._layerwise
        if self.cfg.scheduling_credit is None and floor > 0:
            if self._auto_window is None or self._auto_window.floor != floor:
                self._auto_window = AutoWindow(floor, cap=64 * int(self.cfg.partition_bytes))
            self.kv.window = self._auto_window
        self.kv.queue.credit_bytes = self.kv.window.bytes if self.kv.window is not None else floor

    def fit_default_keys(self, grad_bytes: int) -> int | None:
        """A model's optimizer, before its first step: where BYTEPS_PARTITION_BYTES is unset and the servers
        are on other hosts, shrink the default key so that each server holds at least
        :data:`KEYS_PER_SERVER` of the model's ``grad_bytes`` (never below 1 MiB, where the data lanes stop).
        Why: the step's first key is pulled only after every worker pushed all of it, and its last after
        everything else, each costing about k x key / B that nothing overlaps; with BytePS's 4 MB keys a
        64 MB model over 2 servers spends a quarter of its transfer time there (1 Gbit/s, n = k = 2: 2 MB
        keys 652 ms a step, 4 MB keys 691-699 ms, the bound c + M/B 640 ms; docs/results/line_rate.md).
        Every worker computes the same size from the same model. Returns the new key size, or None."""
        if self.cfg.sources.get("partition_bytes", "default") != "default" or not self.num_servers \
                or self.servers_local:
            return None
        want = max(LANE_MIN_PARTITION_BYTES, int(grad_bytes) // (KEYS_PER_SERVER * self.num_servers))
        want -= want % 64  # whole elements of every dtype
        if want >= int(self.cfg.partition_bytes):
            return None
        # the auto window keeps the floor it has, counted in keys of the unfitted size (every figure in
        # docs/results/line_rate.md was measured so; a floor in fitted keys was not better within the noise)
        self.set_scheduling(partition_bytes=want)
        log.info("worker %d: %d-byte keys (%d per server for %d gradient bytes; BYTEPS_PARTITION_BYTES unset)",
                 self.rank, want, KEYS_PER_SERVER, grad_bytes)
        return want

    def use_priority_order(self) -> None:
        """Layer-wise updates (ScheduledOptimizer): the next forward waits for the layers nearest the input
        first, so the queue orders by priority even under the auto window, which otherwise keeps ready order."""
        self._layerwise = True

        def apply() -> None:
            self.kv.queue.by_priority = True
        self.van.call_soon(apply)

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
                    self.kv.window = None
                    self.kv.queue.by_priority = True  # a scheduling strategy's credit: ByteScheduler's order
                    self.kv.queue.credit_bytes = int(credit_bytes)
                self.kv.admit()
            self.van.call_soon(apply)

    # ------------------------------------------------------------ caller side --
    def check_keys(self, prefix: str = "Gradient.") -> str | None:
        """Once, after a step: warn when a hand-set key size leaves too few keys per server for push and
        pull to overlap (:mod:`pushpull.worker.keycheck`); returns the warning or None. Counts the tensors
        whose name starts with ``prefix`` (a training step's gradients; broadcasts are not in the pipeline)."""
        if getattr(self, "_keys_checked", False):
            return None
        self._keys_checked = True
        from pushpull.config import default_partition_bytes
        from pushpull.worker.keycheck import few_keys_warning

        src = self.cfg.sources.get("partition_bytes", "default")
        if src == "default" or not self.num_servers:
            return None
        with self.table.lock:
            sizes = [sum(p.nbytes for p in e.parts) for n, e in self.table.entries.items() if n.startswith(prefix)]
        msg = few_keys_warning(sizes, int(self.cfg.partition_bytes), int(self.num_servers),
                               default_partition_bytes(self.num_servers), src)
        if msg:
            log.warning("worker %d: %s", self.rank, msg)
        return msg

    def declare(self, name: str, tensor, compression: dict | None = None, spec: KeySpec = PLAIN) -> Entry:
        """Fix ``name``'s shape and dtype from ``tensor`` (a torch tensor or NumPy array) before its first use."""
        kind = kind_of(tensor)
        with self.table.lock:
            return self._entry(name, kind.shape(tensor), kind.dtype(tensor), compression, spec)

    def set_seed(self, name: str, rnd: int, params: np.ndarray, momentum: np.ndarray | None) -> None:
        """The state of key ``name`` (an outer or a store key) after round ``rnd`` as this worker holds it (flat
        arrays in the key's accumulation dtype that it will not write again): what a new server starts the
        key from if its server is lost (TensorTable.seeds). Kept only in an elastic job."""
        if not self.table.keep_seeds:  # not an elastic job: a lost server ends it, no seed is ever used
            return
        if params.ndim != 1 or (momentum is not None and momentum.shape != params.shape):
            raise ValueError(f"tensor {name!r}: a seed is flat parameters and momentum of the same length, got "
                             f"{params.shape} and {None if momentum is None else momentum.shape}")
        self.table.seeds[name] = (int(rnd), params, momentum)

    def _entry(self, name: str, shape: tuple, dtype: DType, compression: dict | None,
               spec: KeySpec = PLAIN) -> Entry:
        """The partition stage (:meth:`TensorTable.entry`) at this config's sizes; with the table lock held."""
        return self.table.entry(name, shape, dtype, compression, spec, self.cfg)

    def submit(self, tensor, output, name: str, average: bool,
               priority: int = 0, compression: dict | None = None, spec: KeySpec = PLAIN, sig: int = 0,
               offset: int = 0) -> Handle:
        """Start a push_pull of ``tensor`` (a torch tensor or a NumPy array: worker/tensors.py) into
        ``output`` (a new one of the same kind if None).

        ``spec``: what the key is (op, readers, ...; :class:`KeySpec`); ``sig``: this round's signature, which
        every worker must send equal (the server fails the round on every rank otherwise); ``offset``: for a
        concat key, the byte offset of this rank's ``tensor`` in the key. A rank that is not among the key's
        readers gets no output (the handle's output is None).

        With the local reduce, sums go through this machine's other processes first (each pushes a slice)."""
        if self.local is not None and self.local.applies(spec) and not isinstance(tensor, np.ndarray):
            self.raise_if_changed(name)
            return self.local.submit(tensor, output, name, average, priority, compression, spec, sig)
        return self.submit_flat(tensor, output, name, average, priority, compression, spec, sig, offset)

    def submit_flat(self, tensor, output, name: str, average: bool,
                    priority: int = 0, compression: dict | None = None, spec: KeySpec = PLAIN, sig: int = 0,
                    offset: int = 0) -> Handle:
        """:meth:`submit` without the local reduce: this process pushes ``tensor`` itself."""
        try:
            kind = kind_of(tensor)
            dtype = kind.dtype(tensor)
        except TypeError as ex:
            raise TypeError(f"push_pull of tensor {name!r}: {ex}") from None
        if self.member.failure:
            raise PushPullError(f"push_pull of tensor {name!r}: {self.member.failure}")
        src, device = kind.host(tensor)
        concat = spec.op == "concat"
        if concat:
            n = kind.numel(src)
            if dtype is not UINT8 or not 0 <= offset <= offset + n <= spec.numel:
                raise ValueError(f"tensor {name!r}: a concat push is uint8 bytes inside the key's {spec.numel} "
                                 f"bytes, got {dtype.name}[{n}] at offset {offset}")
            shape = (spec.numel,)
        else:
            shape = kind.shape(src)
        reader = spec.readers is None or self.rank in spec.readers
        user_out = None
        if not reader:
            out = None
        elif output is None:
            out = kind.empty(shape, dtype) if concat else kind.empty_like(src)
        elif kind.writable(output):
            out = output
        else:
            out = kind.empty(kind.shape(output), kind.dtype(output))
            user_out = output
        gen, entry = self._take_entry(name, shape, dtype, compression, spec)
        inp = kind.raw(src)
        if out is None:
            out_bytes = None
        else:
            out_bytes = inp if kind.same_memory(out, src) and not concat else kind.raw(out)  # in place: one view
        op = Op(Handle(name, None), entry, inp, out, out_bytes, average, priority,
                device=device if reader else None, user_out=user_out, sig=sig, reader=reader, offset=offset,
                kind=kind)
        op.handle._describe = lambda: self.status.describe(op)
        op.handle._abandon = lambda why: self._give_up(op, why)
        op.gen = gen
        op.handle.output = output if output is not None else out
        self.van.call_soon(lambda: self.pipeline.start(op))
        return op.handle

    def _take_entry(self, name: str, shape: tuple, dtype: DType, compression: dict | None,
                    spec: KeySpec) -> tuple[int, Entry]:
        """Mark ``name``'s entry busy for a new op; return the job's generation the op belongs to and the entry.
        Raise WorkersChanged if the job changed since this worker's last operation, ValueError if an op of it is in
        flight. An op of it from before a change (the I/O thread is failing it: restart(), or start() for one
        not started yet) is waited for: its caller already had WorkersChanged and restored, and this is its
        first push after that."""
        deadline = None
        while True:
            with self.table.lock:  # the generation with the change, as _reset() sets them
                self.raise_if_changed(name)
                gen = self.kv.gen
                try:
                    entry = self._entry(name, shape, dtype, compression, spec)
                except ValueError as ex:
                    self._abort_next_round(name, str(ex))
                    raise
                if entry.error:
                    self.stats["errors"] += 1
                    raise PushPullError(entry.error)
                if not entry.busy:
                    entry.busy, entry.busy_gen = True, gen
                    return gen, entry
                if entry.busy_gen == gen:
                    raise ValueError(f"a push_pull of tensor {name!r} is already in flight; wait for it before "
                                     f"starting another with the same name")
            if deadline is None:
                deadline = time.monotonic() + self.cfg.timeout
            elif time.monotonic() > deadline:
                raise PushPullError(f"push_pull of tensor {name!r}: its op from before the change to generation "
                                    f"{gen} was still in flight after {self.cfg.timeout:.0f}s (PUSHPULL_TIMEOUT)")
            if self.member.failure:
                raise PushPullError(f"push_pull of tensor {name!r}: {self.member.failure}")
            time.sleep(0.001)

    def _give_up(self, op: Op, why: str) -> None:
        """The caller's thread, as its deadline passes: the tensor refuses new calls at once (the caller's
        next call must not find it busy), the rest is the I/O thread's (:meth:`_abandon`)."""
        e = op.entry
        with self.table.lock:
            if not e.error:
                e.error = self._unusable(e, op.round, why)
        self.van.call_soon(lambda: self._abandon(op, why))

    def _unusable(self, e: Entry, rnd: int, why: str) -> str:
        return (f"{why}; on rank {self.rank} tensor {e.name!r} is unusable from now on (its round {rnd} was "
                f"abandoned, so its rounds are out of step across the ranks: use another name)")

    def _abandon(self, op: Op, why: str) -> None:
        """On the I/O thread: the caller gave up on ``op`` (its deadline passed). Its round fails on every
        rank (an ABORT for each partition: a server fails the round unless it already completed), and the
        tensor is unusable from now on on this rank: its data may still be on the servers, so no later call
        may take part in a round that could meet it (Horovod's suite: a later call must never sum a failed
        call's push). The other ranks learn it from the servers when they push that round."""
        if op.finished:
            return
        e = op.entry
        error = self._unusable(e, op.round, why)
        if e.state is READY and op.round > 0:
            body = encode_json({"error": f"on rank {self.rank}, {why} (so round {op.round} fails on every rank)"})
            for p in e.parts:
                self.kv.abort(p, op.round, e.code, body)
        self.pipeline.fail_entry(e, error)

    def _abort_next_round(self, name: str, error: str) -> None:
        """This rank cannot take part in the next round of ``name`` (it changed shape, dtype or op): fail
        that round on every rank with ``error``, instead of leaving the others waiting for its push."""
        e = self.table.entries.get(name)
        if e is None or e.state is not READY or e.busy:
            return
        e.state, e.error = FAILED, error
        body = encode_json({"error": f"on rank {self.rank}, {error} (so round {e.round + 1} fails on every rank)"})

        def send() -> None:
            e.round += 1
            for p in e.parts:
                self.kv.abort(p, e.round, e.code, body)
        self.van.call_soon(send)

    def _scheduler_message(self, msg) -> None:
        self.kv.on_scheduler_message(msg)  # the client is made after the membership it reports through

    def join(self) -> int:
        """Horovod's join(): this worker ran out of data. Until every worker has joined, the servers complete
        the others' rounds without it (it contributes nothing, as if it pushed zeros to a sum); then every
        worker's rounds start again and all are released with the rank that joined last. Waits while the
        others train, checking that the cluster is alive, for PUSHPULL_TIMEOUT at most: then it raises
        naming the ranks that have not joined (a peer that exits without joining would hold it forever)."""
        if self.local is not None:
            raise PushPullError(f"join() is not available with the local reduce (BYTEPS_LOCAL_SIZE="
                                f"{self.ident.local_size}): a machine's processes reduce each tensor together; set "
                                f"PUSHPULL_LOCAL_REDUCE=0 to use join()")
        self._join_done.clear()
        while self.kv.inflight or self.kv.queue:  # its own reductions first: a push after JOIN would come too late
            if self.member.failure:
                raise PushPullError(f"join(): {self.member.failure}")
            time.sleep(0.005)
        self.member.send(Header(MsgType.JOIN, key=self.rank))
        deadline = time.monotonic() + self.cfg.timeout
        while True:
            done = self._join_done.wait(0.25)
            if self.member.failure:
                raise PushPullError(f"join(): {self.member.failure}")
            if done:
                break
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.size)) - self.joined_ranks - {self.rank})
                raise PushPullError(f"join() on rank {self.rank}: rank(s) {missing} had not joined within "
                                    f"{self.cfg.timeout:.0f}s (PUSHPULL_TIMEOUT); every rank must call join() "
                                    f"once it runs out of data (joined: {sorted(self.joined_ranks | {self.rank})})")
        return self._join_last

    def _reset(self, d: dict) -> None:
        """The workers changed (elastic; servers have applied it already): take the new rank and size, fail
        every op in flight with WorkersChanged (the caller restores its last commit and goes on), and start
        every tensor's rounds again from 1; declarations still pending, and those of moved partitions, are sent
        again by each tensor's next op (Pipeline.restart)."""
        new_rank = d["ranks"].get(str(self.first_rank))
        if new_rank is None:
            self.member.fail(f"this worker was dropped from the job ({d.get('lost')})")
            return
        # the end of a join() keeps every rank where it was: shared-memory regions stay (the servers keep theirs)
        # (decided as the servers decide: every rank the one it registered as, the size unchanged)
        keep_shared = ("joined_last" in d and int(d["num_workers"]) == self.averager.size
                       and all(int(first) == int(now) for first, now in d["ranks"].items()))
        self.servers_lost.update(int(x) for x in d.get("lost_servers", ()))
        for srv in d.get("servers_added", ()):  # before the moved partitions are declared to it
            self._server_replaced(srv)
        reason = (f"the job changed ({d.get('lost')}): {int(d['num_workers'])} workers, this one is rank "
                  f"{int(new_rank)} now (generation {int(d['gen'])})")
        with self.table.lock:
            # one step for a submit() on the training thread, which reads both under this lock: its op is either
            # of the job before (start() fails it: another generation) or finds the change and raises
            # WorkersChanged. Apart, an op could take the new generation unfailed, go out as a round nobody else
            # pushes, and still be in flight when its caller, restored by a later op's WorkersChanged, pushes the
            # tensor again
            self.kv.gen = int(d["gen"])
            self.kv.rank = int(new_rank)
            self.averager.resize(int(d["num_workers"]))
            self.pipeline.changed_reason = reason
            if d.get("came_in"):
                # with the generation and before the change's mark: whoever catches the WorkersChanged of this
                # change (the mark's, or an op's failed below) reads it and welcomes the newcomer (DiLoCo); set
                # after the mark, a catcher in between went on without the welcome the others held out for
                self.arrival_gen = int(d["gen"])
            self.changed_unseen = "joined_last" not in d  # the end of a join(): nothing to restore
        self.member.node_id = self.rank
        (log.info if "joined_last" in d else log.warning)("%s", reason)
        self.pipeline.restart(reason, {int(k): int(v) for k, v in d.get("moved", {}).items()}, keep_shared)
        if "joined_last" in d:  # the end of a join(), not a change of workers: nothing to restore
            self.joined_ranks = set()
            self._join_last = int(d["joined_last"])
            self._join_done.set()
            return
        for fn in self.on_reset:
            fn(self.rank, self.size)

    def _server_replaced(self, s: dict) -> None:
        """A replacement server took lost server ``s["rank"]``'s place (elastic; on the I/O thread): its
        socket, direct path and lane go to the new address. Its pushes and pulls take ZeroMQ (a data lane
        is opened only at the start)."""
        sock = f"s{int(s['rank'])}"
        address = server_address(s, self.cfg.local_ipc)
        if int(s["rank"]) not in self.servers_lost and self.server_addrs.get(sock) == address:
            return  # announced again (a change made again by a scheduler that took the job over): known already
        self.server_addrs[sock] = address
        self.van.replace_dealer(sock, self.server_addrs[sock], worker_identity(self.first_rank),
                                self.kv.on_server_message, host=str(s["host"]))
        self.direct.replace(sock, f"tcp://{s['host']}:{s['port']}",
                            str(s["lane"]) if s.get("lane") and self.cfg.direct_lane else None)
        self.data_lanes.pop(sock, None)
        self.kv.shm_socks.discard(sock)
        self.servers_lost.discard(int(s["rank"]))
        log.warning("worker %d: server %s is back, at %s", self.rank, s["rank"], self.server_addrs[sock])

    def _recover_state(self) -> dict:
        """What a scheduler that takes the running job over needs from this worker (I/O thread): its
        generation and the job's size as it knows them, the servers lost, and where its tensors live."""
        tensors = []
        for e in list(self.table.entries.values()):
            if e.assigned is None or e.state is FAILED:
                continue
            tensors.append({**e.assign_request(), "key": e.assigned, "servers": [p.server for p in e.parts]})
        return {"gen": self.gen, "size_now": self.size, "servers_lost": sorted(self.servers_lost),
                "tensors": tensors}

    def _fail_all(self, reason: str) -> None:
        self.van.call_soon(lambda: self.pipeline.fail_all(reason))

    def wait(self, handle: Handle, timeout: float | None = None):
        """Block until ``handle`` completes; a dead cluster or a timeout raises."""
        t0 = None if handle.done() else time.perf_counter()
        try:
            failure = (lambda: self.member.failure) if self.local is None else self.local.failure_text
            return handle.wait_alive(timeout or self.cfg.timeout, failure)
        except WorkersChanged:
            self.changed_unseen = False  # the caller knows now: its next operations belong to the new job
            raise
        finally:
            if t0 is not None:
                self.stats["wait_s"] += time.perf_counter() - t0

    def raise_if_changed(self, name: str) -> None:
        """The first operation after a change of the job raises WorkersChanged on a worker that had nothing
        in flight when it happened: it must restore and sync with the others before going on."""
        if self.changed_unseen:
            self.changed_unseen = False
            raise WorkersChanged(f"tensor {name!r}: {self.changed_reason}")
