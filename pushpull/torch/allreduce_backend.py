"""All-reduce backend (``PUSHPULL_BACKEND=allreduce``): torch.distributed
collectives (gloo on CPU, NCCL on GPU) behind the same async submit/wait shape
as push_pull, with ByteScheduler's partitioning, priority and credit.

Why rank 0 decides the order
----------------------------
Collectives match by issue order: if rank 0 issues A then B and rank 1 issues
B then A, both hang (or sum the wrong tensors). Ranks legitimately see
gradients in different orders (autograd scheduling, ``on_ready`` races,
a user submitting in a different order), so the order cannot come from each
rank's own arrivals. As in ByteScheduler, rank 0 decides and the others follow:

* Every rank's *dispatcher* thread is the only thread that issues collectives.
* On rank 0, submitted tensors are split into partitions (``partition_bytes``;
  0 = whole tensors) and queued in a :class:`~pushpull.worker.credit_queue.CreditQueue`
  ordered by priority (then partition index, then arrival). The dispatcher
  admits partitions while the bytes in flight are under the credit (0 =
  unlimited), and broadcasts each admitted batch (everything admissible at
  once) as a small int64 tensor ``[count, (tensor id, offset, numel, total
  numel, dtype) * count]`` over a second, gloo-only *control* group. Tensor
  ids are a 63-bit hash of the name, so no id table needs agreeing on.
* Every rank (rank 0 included) then walks the batch in order: waits until it
  has submitted that tensor itself (up to PUSHPULL_TIMEOUT, then an error
  naming it), and issues ``all_reduce(async_op=True)``. The first time an id
  is seen, all ranks compare its size and dtype with one small control
  all-reduce, so a mismatch fails the tensor on every rank with its name
  instead of hanging; a rank whose tensor differs from rank 0's message later
  fails it by name and reduces zeros in its place, so the ranks' collectives
  stay aligned.
* Tensor fusion: the batch's partitions (up to ``FUSE_PART_BYTES`` each),
  consecutive and of one dtype, are copied into one buffer of at most
  ``FUSE_BYTES`` and reduced by one collective (:func:`fuse_groups`, computed
  from rank 0's message alone, so every rank groups alike; the rule is
  :mod:`pushpull.policy.collective_fusion`, which the simulator applies too); a larger
  partition is reduced in place. A collective has a fixed cost (a chain of
  messages through every rank) that dwarfs copying at memory speed, so a
  stream of small tensors, a backward pass over hundreds of them, pays it
  about once per batch instead of once per tensor.
* CPU tensors go through a gloo group of its own with ``GLOO_THREADS`` threads (gloo's default group has 2),
  and a partition larger than ``SPLIT_BYTES`` is reduced in pieces: gloo runs one collective on one thread,
  a ring step by step, so on a link with delay a single collective is bound by its chain of round trips, not
  the link (43 MB over 4 hosts at 1 Gbit/s with 10 ms one way: 0.98 s alone against the ring's 0.52 s bound;
  in 2-11 pieces on 4 threads 0.56-0.58 s; the same pieces on 2 threads 0.58-0.95 s). Several collectives in
  flight overlap their chains, as DistributedDataParallel's buckets do.
* A *completer* thread waits for the issued works in issue order, copies
  fused results back, returns their credit to rank 0's queue, and completes
  a tensor's handle (dividing by the number of workers for an average) when
  its last partition is in.

Nothing can deadlock on order: a rank's training thread submits all of a
step's gradients before waiting on any, and the dispatcher of a rank that is
behind simply waits for its own submission. When idle, rank 0 sends an empty
batch every second so the others' blocking receive never reaches the gloo
timeout; at exit rank 0 sends STOP. Preemption is ByteScheduler's: a late,
urgent partition overtakes everything still queued on rank 0; nothing in
flight is interrupted, so bytes in flight never exceed credit + one partition.

Rendezvous: the process group is created from pushpull's rank and size with
the TCP store of rank 0 at ``DMLC_PS_ROOT_URI`` port ``PUSHPULL_ALLREDUCE_PORT``
(default ``DMLC_PS_ROOT_PORT + 2``), so rank 0 must run on that host. An
already-initialised default process group is reused.
"""
from __future__ import annotations

import atexit
import datetime
import hashlib
import logging
import os
import queue
import threading
import time

import torch
import torch.distributed as dist

from pushpull import dtypes
from pushpull.policy import collective_fusion
from pushpull.worker.credit_queue import CreditQueue
from pushpull.worker.handle import Handle, PushPullError

log = logging.getLogger(__name__)

SLOTS = 128          # partitions per control message (a longer batch takes several messages)
FIELDS = 5           # id, offset, numel, total numel, dtype code
STOP = -1
# Tensor fusion (as Horovod's): the rule and its limits are pushpull.policy.collective_fusion's, which the
# simulator's ring applies to the same batches (why it pays, and the measured effect, are there).
FUSE_PART_BYTES = collective_fusion.PART_BYTES
FUSE_BYTES = collective_fusion.MAX_BYTES
# CPU collectives: threads of the backend's own gloo group, and the largest piece one collective reduces
# (module docstring); a fused buffer is at most FUSE_BYTES, so pieces are no larger than what fusion makes
GLOO_THREADS = 4
SPLIT_BYTES = FUSE_BYTES
# the dtypes it reduces (those a push_pull carries) and the id ranks compare at first use (pushpull.dtypes)
_DTYPE_CODE = {t: d.header for t, d in dtypes.torch_table().items() if d.header is not None}
_CODE_DTYPE = {c: t for t, c in _DTYPE_CODE.items()}


def fuse_groups(items: list, part_bytes: int | None = None, max_bytes: int | None = None) -> list[list[int]]:
    """Indices of ``items`` ((numel, itemsize, dtype code) each, in rank 0's order) grouped into collectives
    by :func:`pushpull.policy.collective_fusion.fuse_groups`. Computed from rank 0's message only, so every
    rank groups alike."""
    return collective_fusion.fuse_groups([(n * itemsize, code) for n, itemsize, code in items],
                                         FUSE_PART_BYTES if part_bytes is None else part_bytes,
                                         FUSE_BYTES if max_bytes is None else max_bytes)


def split_part(part: tuple, max_bytes: int = SPLIT_BYTES) -> list[tuple]:
    """A partition ``(entry, offset, numel, nbytes, view, ok)`` cut into pieces of at most ``max_bytes``
    (views of its tensor, reduced in place), so that several collectives share its bytes (module docstring).
    Every rank cuts rank 0's partitions alike, so the collectives stay aligned."""
    e, off, n, nbytes, view, ok = part
    if nbytes <= max_bytes or n <= 1:
        return [part]
    pieces = -(-nbytes // max_bytes)
    step = -(-n // pieces)
    itemsize = nbytes // n
    return [(e, off + i, min(step, n - i), min(step, n - i) * itemsize, view[i:i + step], ok)
            for i in range(0, n, step)]


def tensor_id(name: str) -> int:
    """A stable 63-bit id for a tensor name (identical on every rank)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)


class _Entry:
    """One submitted tensor on this rank."""

    __slots__ = ("name", "id", "flat", "user", "handle", "average", "priority", "numel", "issued", "done",
                 "itemsize")

    def __init__(self, name, tid, flat, user, handle, average, priority):
        self.name, self.id, self.flat, self.user, self.handle = name, tid, flat, user, handle
        self.average, self.priority = average, priority
        self.numel = flat.numel()
        self.itemsize = flat.element_size()
        self.issued = 0
        self.done = 0


class AllReducer:
    """Async all-reduce with rank-0-decided order. Build with :func:`get_reducer`."""

    def __init__(self, rank: int, size: int, timeout: float, data_group=None, ctrl_group=None,
                 own_process_group: bool = False, cpu_group=None):
        self.rank, self.size, self.timeout = rank, size, timeout
        self.data_group, self.ctrl_group = data_group, ctrl_group
        self.cpu_group = cpu_group  # a ProcessGroupGloo of GLOO_THREADS threads for CPU tensors (or None)
        self._own_pg = own_process_group
        self._cv = threading.Condition()
        self._submitted: dict[int, _Entry] = {}   # id -> entry not yet fully issued
        self._names: dict[int, str] = {}          # id -> name: collision check, messages
        self._busy: set[str] = set()
        self._checked: set[int] = set()           # ids whose size/dtype all ranks agreed on
        self._queue: CreditQueue = CreditQueue(0)  # rank 0 only
        self._partition_bytes = 0
        self._error: str | None = None
        self._stopping = False
        self._closed = False
        self._issued: "queue.Queue" = queue.Queue()
        self.keepalive_s = min(1.0, timeout / 4)
        self.stats = {"collectives": 0, "fused": 0, "batches": 0, "bytes": 0, "max_in_flight": 0}
        self._threads: list[threading.Thread] = []
        if size > 1:
            for fn, name in ((self._dispatch_loop, "pushpull-allreduce-dispatch"),
                             (self._complete_loop, "pushpull-allreduce-complete")):
                t = threading.Thread(target=fn, name=name, daemon=True)
                t.start()
                self._threads.append(t)

    # ------------------------------------------------------------ caller side --
    def set_scheduling(self, partition_bytes: int = 0, credit_bytes: int = 0) -> None:
        """Partition size and credit in bytes (0 = whole tensors / unlimited).
        Only rank 0's values matter: it cuts and admits partitions for everyone."""
        if partition_bytes < 0 or credit_bytes < 0:
            raise ValueError(f"partition_bytes and credit_bytes must be >= 0, got {partition_bytes}, "
                             f"{credit_bytes}")
        with self._cv:
            self._partition_bytes = int(partition_bytes)
            self._queue.credit_bytes = int(credit_bytes)
            self._cv.notify_all()

    def submit(self, tensor: torch.Tensor, name: str, priority: int = 0, average: bool = True) -> Handle:
        """Start reducing ``tensor`` in place over all ranks; returns a Handle."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all-reduce of {name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _DTYPE_CODE:
            raise TypeError(f"all-reduce of tensor {name!r}: dtype {tensor.dtype} is not supported")
        if self._error:
            raise PushPullError(f"all-reduce of tensor {name!r}: {self._error}")
        if self._closed:
            raise PushPullError(f"all-reduce of tensor {name!r}: the all-reduce backend was shut down")
        tid = tensor_id(name)
        t = tensor.detach()
        flat, user = (t.view(-1), None) if t.is_contiguous() else (t.contiguous().view(-1), t)
        h = Handle(name, tensor)
        entry = _Entry(name, tid, flat, user, h, average, priority)
        h._describe = lambda: self._describe(entry)
        with self._cv:
            other = self._names.setdefault(tid, name)
            if other != name:
                raise ValueError(f"tensor names {name!r} and {other!r} hash to the same id; rename one")
            if name in self._busy:
                raise ValueError(f"an all-reduce of tensor {name!r} is already in flight; wait for it before "
                                 f"starting another with the same name")
            if self.size == 1 or entry.numel == 0:
                self._finish(entry)
                return h
            self._busy.add(name)
            self._submitted[tid] = entry
            if self.rank == 0:
                step = entry.numel if self._partition_bytes <= 0 else \
                    max(1, self._partition_bytes // entry.itemsize)
                for i, off in enumerate(range(0, entry.numel, step)):
                    n = min(step, entry.numel - off)
                    self._queue.push((entry, off, n), n * entry.itemsize, priority, i)
            self._cv.notify_all()
        return h

    def wait(self, handle: Handle, timeout: float | None = None) -> torch.Tensor:
        """Block until ``handle`` completes; a failed reducer or the timeout raises, naming the tensor."""
        return handle.wait_alive(timeout or self.timeout, lambda: self._error, op="all-reduce")

    def _describe(self, e: _Entry) -> str:
        if e.issued == 0:
            if self.rank != 0:
                return "rank 0 has not scheduled it yet"
            q = self._queue
            return (f"still queued on rank 0 ({len(q)} partition(s) queued, {q.in_flight} of {q.credit_bytes or 'unlimited'} "
                    f"credit bytes in flight, {self._issued.qsize()} collective(s) awaiting completion)")
        return f"{e.done} of {e.numel} elements reduced, {e.issued} issued; a slow or missing rank holds it up"

    def close(self) -> None:
        """Stop the threads (rank 0 tells the others) and leave the process group."""
        if self._closed:
            return
        self._closed = True
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._threads:
            self._threads[0].join(self.timeout)
            if self._threads[0].is_alive():
                log.warning("all-reduce dispatcher did not stop within %.0fs (is rank 0 still running?)",
                            self.timeout)
            self._issued.put(None)
            self._threads[1].join(self.timeout)
        self.cpu_group = None  # before the store it connected through goes
        if self._own_pg and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as ex:  # already torn down by the user
                log.debug("destroy_process_group: %r", ex)

    # ------------------------------------------------------------ dispatcher --
    def _dispatch_loop(self) -> None:
        if torch.cuda.is_available():
            from pushpull.torch import ops

            torch.cuda.set_device(ops.local_rank() % torch.cuda.device_count())
        msg = torch.zeros(1 + FIELDS * SLOTS, dtype=torch.int64)
        try:
            while True:
                if self.rank == 0:
                    batch, stop = self._next_batch()
                    # one message per SLOTS partitions; each is issued before the next is sent,
                    # exactly as the other ranks do (the first-use check is a control collective too)
                    for i in range(0, max(len(batch), 1), SLOTS):
                        chunk = [(e.id, off, n, e.numel, _DTYPE_CODE[e.flat.dtype]) for e, off, n in batch[i:i + SLOTS]]
                        msg[0] = len(chunk)
                        if chunk:
                            msg[1:1 + FIELDS * len(chunk)] = torch.tensor(chunk, dtype=torch.int64).view(-1)
                        dist.broadcast(msg, src=0, group=self.ctrl_group)
                        if chunk:
                            self._issue(chunk)
                    if stop:
                        msg[0] = STOP
                        dist.broadcast(msg, src=0, group=self.ctrl_group)
                        return
                else:
                    dist.broadcast(msg, src=0, group=self.ctrl_group)
                    count = int(msg[0])
                    if count == STOP:
                        return
                    if count > 0:
                        self._issue([tuple(v) for v in msg[1:1 + FIELDS * count].view(-1, FIELDS).tolist()])
        except Exception as ex:  # a dead peer, a gloo timeout, a failed local wait
            self._fail_all(f"{type(ex).__name__}: {ex}" if not isinstance(ex, PushPullError) else str(ex))

    def _next_batch(self) -> tuple[list, bool]:
        """Rank 0: wait for admissible partitions (or a keep-alive tick) and admit them."""
        with self._cv:
            deadline = time.monotonic() + self.keepalive_s
            while not self._admissible() and not (self._stopping and len(self._queue) == 0):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            batch: list = []
            self._queue.admit(lambda item, nb: batch.append(item))
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self._queue.max_in_flight)
            return batch, self._stopping and not batch and len(self._queue) == 0

    def _admissible(self) -> bool:
        q = self._queue
        return len(q) > 0 and (q.credit_bytes <= 0 or q.in_flight < q.credit_bytes)

    def _local(self, tid: int) -> _Entry:
        """Wait until this rank has submitted tensor ``tid`` (chosen by rank 0)."""
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while tid not in self._submitted:
                left = deadline - time.monotonic()
                if left <= 0 or (self._stopping and self._closed):
                    name = self._names.get(tid)
                    what = f"tensor {name!r}" if name else f"a tensor (id {tid:#x}) this rank never used"
                    mine = sorted(e.name for e in self._submitted.values())[:5]
                    raise PushPullError(f"rank 0 reduces {what} but rank {self.rank} did not submit it within "
                                        f"{self.timeout:.0f}s; rank {self.rank} is waiting on {mine}: do all ranks "
                                        f"reduce the same tensors?")
                self._cv.wait(min(left, 0.5))
            return self._submitted[tid]

    def _issue(self, items: list) -> None:
        """Every rank: issue the batch's all-reduces in rank 0's order, small partitions fused."""
        entries = [self._local(tid) for tid, _, _, _, _ in items]
        new = []
        for e in entries:
            if e.id not in self._checked and e not in new:
                new.append(e)
        bad: set[int] = set()
        if new:  # first use: every rank compares size and dtype, so a mismatch fails everywhere
            v = torch.tensor([[e.numel, _DTYPE_CODE[e.flat.dtype]] for e in new], dtype=torch.int64)
            both = torch.cat([v, -v], dim=1)
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.ctrl_group)
            for e, (hi_n, hi_t, lo_n, lo_t) in zip(new, both.tolist()):
                self._checked.add(e.id)
                if hi_n != -lo_n or hi_t != -lo_t:
                    bad.add(e.id)
                    self._fail_entry(e, f"tensor {e.name!r}: ranks disagree on its size or dtype (numel from "
                                        f"{-lo_n} to {hi_n}; this rank has {e.numel} {e.flat.dtype}); all-reduce "
                                        f"needs the same shape on every rank")
        self.stats["batches"] += 1
        parts = []   # (entry, offset, numel, bytes, view to reduce, whether the result is the entry's)
        for (tid, off, n, total, code), e in zip(items, entries):
            if tid in bad:  # every rank skips it (the check's result is the same everywhere)
                with self._cv:
                    self._submitted.pop(tid, None)
                self._issued.put((None, [(e, off, n, n * e.itemsize, None, False)], None))
                continue
            dtype = _CODE_DTYPE[code]
            if total != e.numel or dtype != e.flat.dtype:
                # changed after the first-use check: keep the collective sequence (and the fusion) aligned
                # with rank 0's message, which every rank groups alike
                self._fail_entry(e, f"tensor {e.name!r}: rank 0 has {total} elements of {dtype}, rank "
                                    f"{self.rank} {e.numel} of {e.flat.dtype}; all-reduce needs the same shape "
                                    f"and dtype on every rank")
                parts.append((e, off, n, n * dtype.itemsize, torch.zeros(n, dtype=dtype, device=e.flat.device),
                              False))
            else:
                parts.append((e, off, n, n * e.itemsize, e.flat[off:off + n], True))
        if self.cpu_group is not None:  # pieces only where collectives can run side by side (CPU, GLOO_THREADS)
            parts = [piece for p in parts for piece in (split_part(p) if p[4].device.type == "cpu" else [p])]
        groups = fuse_groups([(p[2], p[4].element_size(), _DTYPE_CODE[p[4].dtype]) for p in parts])
        for g in groups:
            members = [parts[i] for i in g]
            buf = None
            if len(members) == 1:
                work = self._all_reduce(members[0][4])
            else:
                buf = torch.cat([p[4] for p in members])
                work = self._all_reduce(buf)
            self.stats["collectives"] += 1
            self.stats["fused"] += len(members) if buf is not None else 0
            with self._cv:
                for e, off, n, nbytes, _, _ in members:
                    self.stats["bytes"] += nbytes
                    e.issued += n
                    if e.issued >= e.numel:
                        self._submitted.pop(e.id, None)
            self._issued.put((work, members, buf))

    def _all_reduce(self, t: torch.Tensor):
        """Start the sum of ``t`` on every rank: CPU tensors on the backend's own gloo group, others (CUDA:
        NCCL) on the job's."""
        if self.cpu_group is not None and t.device.type == "cpu":
            return self.cpu_group.allreduce([t], dist.AllreduceOptions())
        return dist.all_reduce(t, group=self.data_group, async_op=True)

    # ------------------------------------------------------------ completer --
    def _complete_loop(self) -> None:
        while True:
            rec = self._issued.get()
            if rec is None:
                return
            work, members, buf = rec
            err = None
            if work is not None:
                try:
                    work.wait(datetime.timedelta(seconds=self.timeout))
                    if buf is not None:  # fused: the results go back to their tensors
                        at = 0
                        for _, _, n, _, view, ok in members:
                            if ok:
                                view.copy_(buf[at:at + n])
                            at += n
                    if members[0][4].is_cuda:
                        torch.cuda.current_stream(members[0][4].device).synchronize()
                except Exception as ex:
                    err = f"all-reduce of tensor {members[0][0].name!r} failed: {ex}"
            finished = []
            with self._cv:
                if self.rank == 0:
                    self._queue.release(sum(m[3] for m in members))
                    self._cv.notify_all()
                for e, _, n, _, _, _ in members:
                    e.done += n
                    if e.done >= e.numel:
                        finished.append(e)
            if err:
                for e, *_ in members:
                    self._fail_entry(e, err)
                self._fail_all(err)
                continue
            for e in finished:
                if not e.handle.done():
                    self._finish(e)

    def _finish(self, e: _Entry) -> None:
        try:
            if e.average and self.size > 1:
                if e.flat.dtype.is_floating_point:
                    e.flat.div_(self.size)
                else:
                    e.flat.copy_(torch.div(e.flat, self.size, rounding_mode="trunc"))
            if e.user is not None:
                e.user.copy_(e.flat.view_as(e.user))
        except Exception as ex:
            self._fail_entry(e, f"tensor {e.name!r}: writing the result failed: {ex!r}")
            return
        with self._cv:
            self._busy.discard(e.name)
        e.handle.complete()

    def _fail_entry(self, e: _Entry, error: str) -> None:
        with self._cv:
            self._busy.discard(e.name)
        e.handle.fail(error)

    def _fail_all(self, error: str) -> None:
        log.error("all-reduce backend failed: %s", error)
        with self._cv:
            if self._error is None:
                self._error = error
            pending = list(self._submitted.values())
            self._submitted.clear()
            self._cv.notify_all()
        for e in pending:
            self._fail_entry(e, f"all-reduce of tensor {e.name!r}: {error}")


_reducer: AllReducer | None = None
_lock = threading.Lock()


def get_reducer() -> AllReducer:
    """The process's reducer; the first call joins the process group (all ranks must call it)."""
    global _reducer
    with _lock:
        if _reducer is None:
            _reducer = _create()
            atexit.register(shutdown)
        return _reducer


def process_group_backend(cuda: bool, local_size: int = 1, gpus: int = 1) -> str:
    """The backend string the all-reduce process group is joined with. With CUDA, NCCL for CUDA tensors and gloo
    for CPU ones: an NCCL-only group fails every CPU tensor ('No backend type associated with device type cpu'),
    which a job on a GPU machine reducing CPU gradients, metrics or ids would hit. Where a host runs more ranks
    than it has GPUs, two ranks share a GPU and NCCL refuses the group at the first collective ('Duplicate GPU
    detected', seen on a one-GPU machine with 2 ranks): gloo then reduces the CUDA tensors too."""
    if not cuda:
        return "gloo"
    if local_size > gpus:
        log.warning("all-reduce backend: %d ranks on this host share %d GPU(s), which NCCL refuses; reducing CUDA "
                    "tensors with gloo instead", local_size, gpus)
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def use_job_interface(interface: str | None, environ) -> None:
    """Where the job names its interface (DMLC_INTERFACE) and GLOO_SOCKET_IFNAME is unset, gloo uses it too:
    otherwise gloo takes the address the host name resolves to (often 127.0.x.1), which a peer on another
    host cannot reach (seen on the emulated cluster: 'Connection refused, remote=[127.0.0...')."""
    if interface and not environ.get("GLOO_SOCKET_IFNAME"):
        environ["GLOO_SOCKET_IFNAME"] = interface


def _create() -> AllReducer:
    from pushpull.torch import ops

    cfg = ops.config()
    rank, size = ops.rank(), ops.size()
    timeout = datetime.timedelta(seconds=cfg.timeout)
    if size == 1 and not dist.is_initialized():
        return AllReducer(0, 1, cfg.timeout)
    own = False
    if not dist.is_initialized():
        port = cfg.allreduce_port or cfg.root_port + 2
        cuda = torch.cuda.is_available()
        backend = process_group_backend(cuda, ops.local_size(), torch.cuda.device_count() if cuda else 0)
        use_job_interface(cfg.interface, os.environ)
        try:
            dist.init_process_group(backend, init_method=f"tcp://{cfg.root_uri}:{port}", rank=rank,
                                    world_size=size, timeout=timeout)
        except Exception as ex:
            raise PushPullError(f"all-reduce backend: joining the {backend} process group at "
                                f"{cfg.root_uri}:{port} as rank {rank}/{size} failed: {ex} (rank 0 must run on "
                                f"DMLC_PS_ROOT_URI; set PUSHPULL_ALLREDUCE_PORT if the port is taken)") from ex
        own = True
    elif (dist.get_rank(), dist.get_world_size()) != (rank, size):
        raise PushPullError(f"all-reduce backend: torch.distributed is initialised as rank "
                            f"{dist.get_rank()}/{dist.get_world_size()} but pushpull is rank {rank}/{size}")
    ctrl = dist.new_group(backend="gloo", timeout=timeout)
    cpu = _cpu_group(rank, size, timeout, f"pushpull-cpu-data/{ctrl.group_name}")
    # every rank reduces CPU tensors on that group or none does: a rank that could not build it would
    # otherwise issue its collectives on another group than the others'
    have = torch.tensor([0 if cpu is None else 1], dtype=torch.int32)
    dist.all_reduce(have, op=dist.ReduceOp.MIN, group=ctrl)
    if cpu is not None and not int(have):
        log.warning("all-reduce backend: another rank has no gloo group of %d threads; CPU tensors go through "
                    "the job's group on every rank", GLOO_THREADS)
        cpu = None
    log.info("all-reduce backend: rank %d/%d, %s%s", rank, size, dist.get_backend(),
             f", CPU tensors on gloo with {GLOO_THREADS} threads" if cpu is not None else "")
    return AllReducer(rank, size, cfg.timeout, None, ctrl, own, cpu)


def _cpu_group(rank: int, size: int, timeout: datetime.timedelta, prefix: str):
    """A gloo group with ``GLOO_THREADS`` threads, on the interfaces the job's gloo uses (GLOO_SOCKET_IFNAME),
    through the job's rendezvous store under ``prefix`` (one per reducer: a later one must not meet an earlier
    one's addresses). Every rank builds it at once (it connects every pair). None, and the job's group for
    every tensor, where it cannot be built (logged): a slower path, not a failure."""
    if os.environ.get("GLOO_DEVICE_TRANSPORT"):
        return None  # a transport of the user's choosing: keep the group torch built with it
    try:
        from torch.distributed import ProcessGroupGloo

        store = dist.PrefixStore(prefix, dist.distributed_c10d._get_default_store())
        opts = ProcessGroupGloo._Options()
        names = [i for i in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if i]
        opts._devices = ([ProcessGroupGloo.create_device(interface=i) for i in names] if names
                         else [ProcessGroupGloo.create_default_device()])
        opts._threads = GLOO_THREADS
        opts._timeout = timeout
        return ProcessGroupGloo(store, rank, size, opts)
    except Exception as ex:  # noqa: BLE001 - private torch API: fall back to the job's group
        log.warning("all-reduce backend: no gloo group of %d threads for CPU tensors (%r); they go through the "
                    "job's group", GLOO_THREADS, ex)
        return None


def shutdown() -> None:
    """Close the reducer (also registered with atexit)."""
    global _reducer
    with _lock:
        r, _reducer = _reducer, None
    if r is not None:
        r.close()
