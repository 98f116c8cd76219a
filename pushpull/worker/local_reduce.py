"""Hierarchical local reduce: the worker processes of one machine reduce among themselves through shared
memory first, then each pushes and pulls only 1/local_size of every tensor, and they gather the slices
back (BytePS's reduce-scatter -> push/pull -> all-gather inside a machine; Jiang et al., OSDI 2020, §4).

Why: without it every process is its own network endpoint, so a machine with local_size processes sends
each gradient local_size times over its one link. With it the link carries each gradient once, split over
the local processes: slice j of every tensor is pushed by local rank j of each machine, so the key of a
slice has one pusher per machine (:class:`~pushpull.worker.table.KeySpec` ``writers``; the servers wait
for exactly those ranks). Sums are those of the flat path; an average still divides by the global size.

How: one shared-memory file per tensor name and machine, ``local_size`` slots of the tensor's bytes plus a
row of counters per local process (its pid and size, and the rounds it has written, reduced and gathered).
Each step of an operation waits only on its own tensor's counters, so processes may submit tensors in
different orders without deadlock. Files live in /dev/shm, mode 0600, named from a hash of the job secret,
the run's job id (from the scheduler) and the machine, so other users cannot open them and nobody can guess
them; the first local rank unlinks each file once every local process has mapped it (nothing is left
behind). Each wait checks that the local processes it waits for are alive (pid, zombie state): a dead one
fails the operation within a fraction of a second, naming its local rank; any wait ends after
PUSHPULL_TIMEOUT naming who it waited for.

Counters are published with plain aligned 8-byte stores after the data they cover; this relies on x86-64's
store ordering (checked there only). CPU only: a GPU machine would reduce with NCCL (not written: this
project has no GPU to test it on).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import mmap
import os
import queue
import tempfile
import threading
import time
from typing import Callable

import numpy as np
import torch

from pushpull import dtypes
from pushpull.worker.handle import Handle, PushPullError

log = logging.getLogger(__name__)

MAX_LOCAL = 256
ROW = 8  # int64 fields per local process: pid, nbytes, arrived, reduced, gathered, failed, -, -
PID, NBYTES, ARRIVED, REDUCED, GATHERED, FAILED = range(6)
ALIGN = 64
LIVENESS_S = 0.2  # how often a waiting operation checks that the processes it waits for are alive


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def pid_dead(pid: int | None) -> bool:
    """True when process ``pid`` has exited (a zombie not yet reaped by its parent counts as exited)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def slice_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Element ranges of the ``parts`` slices of a tensor: as equal as can be, in local-rank order."""
    return [(numel * j // parts, numel * (j + 1) // parts) for j in range(parts)]


class Segment:
    """One tensor's shared memory on this machine: a header of counter rows and ``local_size`` slots."""

    def __init__(self, path: str, local_size: int, nbytes: int, name: str):
        self.path = path
        self.slot_bytes = _round_up(max(nbytes, 1), ALIGN)
        self.header = _round_up(local_size * ROW * 8, 4096)
        size = self.header + local_size * self.slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise PushPullError(f"tensor {name!r}: the local reduce's shared memory {path} belongs to uid "
                                    f"{st.st_uid} with mode {oct(st.st_mode & 0o777)}, not to this user with "
                                    f"0600; refusing it (remove it, or set PUSHPULL_LOCAL_REDUCE=0)")
            if st.st_size < size:
                os.ftruncate(fd, size)
            elif st.st_size != size:
                raise PushPullError(f"tensor {name!r}: the local reduce's shared memory {path} has "
                                    f"{st.st_size} bytes, this process needs {size}: the local processes use "
                                    f"tensors of different sizes under this name")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.ctr = np.frombuffer(self.mm, dtype=np.int64, count=local_size * ROW).reshape(local_size, ROW)
        self.data = np.frombuffer(self.mm, dtype=np.uint8, count=local_size * self.slot_bytes, offset=self.header)
        self.linked = True

    def slot(self, q: int) -> np.ndarray:
        return self.data[q * self.slot_bytes:(q + 1) * self.slot_bytes]

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class LocalOp:
    """One push_pull through the local reduce, moved along by the local-reduce thread."""

    __slots__ = ("handle", "name", "inp", "out", "out_bytes", "user_out", "device", "average", "priority",
                 "compression", "spec", "sig", "round", "seg", "stage", "net", "since", "dtype", "numel",
                 "waiting")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class LocalReduce:
    """The local reduce of one worker process; created by the engine when it applies (``applies``), which
    hands in what it uses of the engine: ``push_pull`` (its submit without the local reduce: a slice's
    reduction across machines), ``failure`` (the cluster's failure text, or None) and ``engine_stats``
    (its counters: errors raised to the caller)."""

    def __init__(self, push_pull: Callable[..., Handle], failure: Callable[[], str | None], engine_stats: dict,
                 local_rank: int, local_size: int, group: list[int], pids: dict[int, int | None],
                 tag: str, num_machines: int, timeout: float):
        if local_size > MAX_LOCAL:
            raise PushPullError(f"BYTEPS_LOCAL_SIZE={local_size}: the local reduce takes at most {MAX_LOCAL} "
                                f"processes per machine; set PUSHPULL_LOCAL_REDUCE=0")
        self.push_pull = push_pull
        self.cluster_failure = failure
        self.engine_stats = engine_stats
        self.p = local_rank
        self.L = local_size
        self.group = group  # global rank of each local rank
        self.pids = pids    # local rank -> pid (from the scheduler's address book)
        self.tag = tag
        self.num_machines = num_machines
        self.timeout = timeout
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.segments: dict[str, Segment] = {}
        self.shapes: dict[str, tuple] = {}
        self.rounds: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.busy: set[str] = set()
        self.lock = threading.Lock()
        self.ops: list[LocalOp] = []
        self.stopping = False
        self.stats = {"ops": 0, "bytes_reduced": 0}
        self.thread = threading.Thread(target=self._run, name="local-reduce", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ set-up --
    @staticmethod
    def plan(book: dict, rank: int, local_rank: int, local_size: int, mode: str, servers_local: bool,
             min_workers: int, secret: str | None) -> tuple[dict | None, str]:
        """Whether the job reduces locally, decided from the address book alone so that every worker decides
        the same (the slices' keys must match on all machines): a dict of the arguments, or None and why not.
        ``mode``: PUSHPULL_LOCAL_REDUCE (auto | on | off); every worker's own is in the book."""
        if local_size <= 1:
            return None, "one process per machine"
        workers = book.get("workers") or []
        size = int(book.get("num_workers", len(workers)))

        def on(m) -> bool:
            return m == "on" or (m in ("auto", None) and not servers_local)
        off = sorted(int(w["rank"]) for w in workers if not on(w.get("local_reduce", mode)))
        if off or not on(mode):
            if servers_local and not any(w.get("local_reduce") == "off" for w in workers) and mode != "off":
                return None, "every server is on this host (PUSHPULL_LOCAL_REDUCE=auto saves no link here)"
            return None, f"PUSHPULL_LOCAL_REDUCE is off on rank(s) {off or [rank]}"
        if min_workers:
            return None, "elastic training (PUSHPULL_MIN_WORKERS) renumbers ranks; a machine's group would break"
        if size % local_size or rank % local_size != local_rank:
            return None, (f"ranks are not numbered machine by machine (rank {rank}, local rank {local_rank}, "
                          f"{size} workers, {local_size} per machine)")
        by_rank = {int(w["rank"]): w for w in workers}
        for m in range(size // local_size):
            hosts = {by_rank.get(m * local_size + j, {}).get("hostname") for j in range(local_size)}
            if len(hosts) != 1:
                return None, (f"the ranks of machine {m} ({m * local_size}..{(m + 1) * local_size - 1}) run on "
                              f"different hosts {sorted(map(str, hosts))}: check BYTEPS_LOCAL_SIZE")
        machine = rank // local_size
        group = [machine * local_size + j for j in range(local_size)]
        digest = hashlib.sha256(b"pushpull local reduce v1\0" + (secret or "").encode() + b"\0"
                                + str(book.get("job_id", "")).encode() + b"\0" + str(machine).encode()).hexdigest()
        pids = {j: by_rank.get(r, {}).get("pid") for j, r in enumerate(group)}
        return {"local_rank": local_rank, "local_size": local_size, "group": group, "pids": pids,
                "tag": digest[:32], "num_machines": size // local_size}, ""

    def applies(self, spec) -> bool:
        """Sums (plain or averaged) over every rank; other collectives (min/max, concat, readers, the
        asynchronous store) take the flat path."""
        return spec.op == "sum" and spec.readers is None and spec.writers is None

    def _path(self, name: str) -> str:
        h = hashlib.sha256(name.encode()).hexdigest()[:24]
        return os.path.join(shm_dir(), f"pushpull-{self.tag}-{h}")

    # ------------------------------------------------------------ caller side --
    def submit(self, tensor: torch.Tensor, output: torch.Tensor | None, name: str, average: bool, priority: int,
               compression, spec, sig: int) -> Handle:
        from pushpull.worker.table import raw_bytes

        d = dtypes.torch_table().get(tensor.dtype)
        if d is None or d.header is None:
            raise TypeError(f"push_pull of tensor {name!r}: dtype {tensor.dtype} is not supported")
        failure = self.cluster_failure()
        if failure:
            raise PushPullError(f"push_pull of tensor {name!r}: {failure}")
        device = tensor.device
        src = tensor.detach()
        if src.device.type != "cpu":
            src = src.to("cpu")
        src = src.contiguous()
        user_out = None
        if output is None:
            out = torch.empty_like(src, memory_format=torch.contiguous_format)
        elif output.device.type == "cpu" and output.is_contiguous():
            out = output
        else:
            out = torch.empty(output.shape, dtype=output.dtype)
            user_out = output
        with self.lock:
            if name in self.failed:
                raise PushPullError(self.failed[name])
            shape = (tuple(src.shape), src.dtype)
            if self.shapes.setdefault(name, shape) != shape:
                raise ValueError(f"tensor {name!r} was used as {self.shapes[name][1]}{list(self.shapes[name][0])} "
                                 f"and is now {src.dtype}{list(src.shape)}; give different tensors different names")
            if name in self.busy:
                raise ValueError(f"a push_pull of tensor {name!r} is already in flight; wait for it before "
                                 f"starting another with the same name")
            self.busy.add(name)
            self.rounds[name] = rnd = self.rounds.get(name, 0) + 1
        inp = raw_bytes(src)
        h = Handle(name, output if output is not None else out)
        op = LocalOp(handle=h, name=name, inp=inp, out=out,
                     out_bytes=inp if out.data_ptr() == src.data_ptr() else raw_bytes(out), user_out=user_out,
                     device=device if device.type != "cpu" else None, average=average, priority=priority,
                     compression=compression, spec=spec, sig=sig, round=rnd, seg=None, stage="free", net=None,
                     since=time.monotonic(), dtype=src.dtype, numel=src.numel(), waiting=[])
        h._describe = lambda: self._describe(op)
        self.inbox.put(op)
        self.wake.set()
        return h

    def _describe(self, op: LocalOp) -> str:
        net = op.net
        if op.stage == "net" and net is not None and not net.done():
            return f"its slice's push_pull: {net.describe()}"
        return f"the local reduce waits ({op.stage}) for local rank(s) {op.waiting}"

    # ------------------------------------------------------------ thread --
    def _run(self) -> None:
        idle = 0
        last_check = time.monotonic()
        while not self.stopping:
            while True:
                try:
                    op = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self.ops.append(op)
            moved = False
            for op in list(self.ops):
                try:
                    moved |= self._advance(op)
                except PushPullError as ex:
                    self._finish(op, str(ex))
                except Exception as ex:  # noqa: BLE001 - an op fails, the thread goes on
                    log.exception("local reduce of %r failed", op.name)
                    self._finish(op, f"tensor {op.name!r}: the local reduce failed: {ex!r}")
            if not self.ops:
                self.wake.wait(0.5)
                self.wake.clear()
                idle = 0
                continue
            now = time.monotonic()
            if now - last_check >= LIVENESS_S:
                last_check = now
                self._check_waiting(now)
            if moved:
                idle = 0
                continue
            idle += 1
            # ops on the network are woken by their handle's callback; only waits on local peers poll
            polling = any(op.stage != "net" for op in self.ops)
            self.wake.wait(min(1e-3, 2e-5 * idle) if polling else LIVENESS_S)
            self.wake.clear()
        for op in list(self.ops):
            self._finish(op, f"tensor {op.name!r}: the engine shut down")

    def failure_text(self) -> str | None:
        """The cluster's failure, saying which local process it was when one of this machine's died (the
        scheduler sees a dead process's connection close and tells everyone at once)."""
        failure = self.cluster_failure()
        if failure:
            dead = [q for q in range(self.L) if q != self.p and pid_dead(self.pids.get(q))]
            if dead:
                return f"{failure} (local rank(s) {dead} of this machine, pid(s) {[self.pids[q] for q in dead]}, died)"
        return failure

    def _check_waiting(self, now: float) -> None:
        failure = self.failure_text()
        for op in list(self.ops):
            if failure:
                self._finish(op, f"tensor {op.name!r}: {failure}")
                continue
            if op.stage == "net":
                continue  # the engine's own deadlines and liveness apply
            dead = [q for q in op.waiting if pid_dead(self.pids.get(q))]
            if dead:
                self._finish(op, f"tensor {op.name!r}: local rank(s) {dead} (rank(s) "
                                 f"{[self.group[q] for q in dead]}, pid(s) {[self.pids.get(q) for q in dead]}) "
                                 f"died while the local reduce waited for them ({op.stage}, round {op.round})")
            elif now - op.since > self.timeout:
                self._finish(op, f"push_pull of tensor {op.name!r} did not finish within {self.timeout:.0f}s "
                                 f"(PUSHPULL_TIMEOUT): the local reduce waited ({op.stage}, round {op.round}) for "
                                 f"local rank(s) {op.waiting} (rank(s) {[self.group[q] for q in op.waiting]})")

    def _segment(self, op: LocalOp) -> Segment:
        seg = self.segments.get(op.name)
        if seg is None:
            seg = Segment(self._path(op.name), self.L, len(op.inp), op.name)
            seg.ctr[self.p, PID] = os.getpid()
            seg.ctr[self.p, NBYTES] = len(op.inp)
            self.segments[op.name] = seg
        return seg

    def _peers_failed(self, op: LocalOp, c: np.ndarray) -> None:
        bad = [q for q in range(self.L) if q != self.p and c[q, FAILED] >= op.round]
        if bad:
            raise PushPullError(f"tensor {op.name!r}: local rank(s) {bad} (rank(s) {[self.group[q] for q in bad]}) "
                                f"could not reduce their slice of round {op.round} (their error says why)")

    def _advance(self, op: LocalOp) -> bool:
        """One step of ``op`` if what it waits for is there; True when it moved."""
        r, p = op.round, self.p
        if op.seg is None:
            op.seg = self._segment(op)
        seg = op.seg
        c = seg.ctr
        if op.stage == "free":  # every local process has gathered the previous round out of the slots
            behind = np.flatnonzero(c[:, GATHERED] < r - 1)
            if len(behind):
                self._peers_failed(op, c)
                op.waiting = behind.tolist()
                return False
            np.copyto(seg.slot(p)[:len(op.inp)], op.inp)
            c[p, ARRIVED] = r  # published after the data (x86-64 keeps stores in order)
            op.stage, op.since, op.waiting = "arrived", time.monotonic(), []
            return True
        if op.stage == "arrived":  # every local process's input is in its slot: reduce this one's slice
            behind = np.flatnonzero(c[:, ARRIVED] < r)
            if len(behind):
                self._peers_failed(op, c)
                op.waiting = behind.tolist()
                return False
            if (c[:, NBYTES] != len(op.inp)).any():
                sizes = {int(q): int(c[q, NBYTES]) for q in range(self.L)}
                raise PushPullError(f"tensor {op.name!r}: the local processes push different sizes under this "
                                    f"name (bytes by local rank: {sizes})")
            if r == 1 and p == 0:
                seg.unlink()  # every local process has it mapped: nothing stays behind in /dev/shm
            self._reduce_slice(op)
            return True
        if op.stage == "net":
            h = op.net
            if not h.done():
                return False
            if h.error is not None:
                c[p, FAILED] = r
                raise PushPullError(h.error)
            c[p, REDUCED] = r
            op.stage, op.since = "reduced", time.monotonic()
            return True
        if op.stage == "reduced":  # every slice is back: gather them into the output
            behind = np.flatnonzero(c[:, REDUCED] < r)
            if len(behind):
                self._peers_failed(op, c)
                op.waiting = behind.tolist()
                return False
            item = op.out.element_size()
            for q, (lo, hi) in enumerate(slice_bounds(op.numel, self.L)):
                if hi > lo:
                    np.copyto(op.out_bytes[lo * item:hi * item], seg.slot(q)[lo * item:hi * item])
            c[p, GATHERED] = r
            self._finish(op, None)
            return True
        raise AssertionError(op.stage)

    def _reduce_slice(self, op: LocalOp) -> None:
        """Sum this process's slice over the local slots (in local-rank order) into its own slot, then start
        its push_pull over the machines, in place."""
        r, p, seg = op.round, self.p, op.seg
        lo, hi = slice_bounds(op.numel, self.L)[p]
        if hi <= lo:  # a tensor with fewer elements than local processes: nothing for this one
            seg.ctr[p, REDUCED] = r
            op.stage, op.since = "reduced", time.monotonic()
            return
        item = op.out.element_size()
        b0, b1 = lo * item, hi * item
        views = [_typed(seg.slot(q)[b0:b1], op.dtype) for q in range(self.L)]
        mine = views[p]
        others = [v for q, v in enumerate(views) if q != p]
        if op.dtype in (torch.float16, torch.bfloat16):  # accumulate in float32, round once (as the servers)
            acc = mine.float()
            for v in others:
                acc.add_(v.float())
            mine.copy_(acc)
        else:  # integers wrap as on the servers (two's complement sums are exact in any order)
            for v in others:
                mine.add_(v)
        self.stats["ops"] += 1
        self.stats["bytes_reduced"] += b1 - b0
        writers = tuple(m * self.L + p for m in range(self.num_machines))
        spec = dataclasses.replace(op.spec, writers=writers)
        op.net = self.push_pull(mine, mine, f"{op.name}#local{p}of{self.L}", op.average, op.priority,
                                op.compression, spec, op.sig)
        op.net.add_done_callback(lambda _h: self.wake.set())
        op.stage, op.since, op.waiting = "net", time.monotonic(), []

    def _finish(self, op: LocalOp, error: str | None) -> None:
        if op in self.ops:
            self.ops.remove(op)
        if error is None and op.out is not None:
            try:
                if op.user_out is not None:
                    op.user_out.copy_(op.out)
                elif op.device is not None:
                    op.handle.output = op.out.to(op.device)
            except Exception as ex:  # noqa: BLE001 - e.g. a device copy failing
                error = f"tensor {op.name!r}: finishing the output failed: {ex!r}"
        with self.lock:
            self.busy.discard(op.name)
            if error is not None:
                # the peers' counters no longer line up for this name: later rounds fail at once, as a
                # tensor the servers refused does on the flat path
                self.failed.setdefault(op.name, error)
        if error is not None and op.seg is not None and op.seg.ctr is not None:
            op.seg.ctr[self.p, FAILED] = max(int(op.seg.ctr[self.p, FAILED]), op.round)
            op.seg.unlink()  # the name is failed for good: nothing may stay behind in /dev/shm, crash or not
        if error is None:
            op.handle.complete()
        else:
            self.engine_stats["errors"] += 1
            op.handle.fail(error)

    def close(self) -> None:
        self.stopping = True
        self.wake.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=2.0)
        for seg in self.segments.values():
            seg.unlink()


def _typed(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(raw).view(dtype)
