"""The worker's tensor table: what it knows about each named tensor (:class:`Entry`), the partitions a
tensor is cut into (the pipeline's first stage, :meth:`TensorTable.entry`) and one push_pull call in
flight (:class:`Op`).

Records only: the key-value client (:mod:`pushpull.worker.kv_client`) and the tensor pipeline
(:mod:`pushpull.worker.pipeline`) read and move them; nothing here sends a message.
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from pushpull import dtypes
from pushpull.config import max_partition_bytes
from pushpull.policy.base import key_sizes
from pushpull.transport.protocol import dtype_code
from pushpull.worker.handle import Handle
from pushpull.worker.tensors import kind_of

SUPPORTED = set(dtypes.TENSOR_NAMES)  # the dtypes a push_pull carries, by name (pushpull.dtypes)


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


def describe_spec(spec: KeySpec) -> str:
    text = f"{spec.kind} (op {spec.op}"
    if spec.readers is not None:
        text += f", received by rank(s) {list(spec.readers)}"
    if spec.writers is not None:
        text += f", pushed by rank(s) {list(spec.writers)}"
    for k, v in spec.meta:
        text += f", {k} {v}"
    return text + ")"


def new_stats() -> dict:
    """A worker's counters (``Engine.stats``): the pipeline, the direct path and the metrics add to them."""
    return {"bytes_pushed": 0, "bytes_pulled": 0, "partitions": 0, "direct_calls": 0, "errors": 0, "shm_pushes": 0,
            "bytes_pushed_raw": 0,  # before compression: bytes_pushed_raw / bytes_pushed is the ratio
            # seconds: some operation in flight (the I/O thread's), the caller blocked waiting for one, and the
            # direct path's calls (both at once: all of a blocking call is exposed)
            "comm_s": 0.0, "wait_s": 0.0, "direct_s": 0.0}


def raw_bytes(t) -> np.ndarray:
    """A writable uint8 NumPy view of a contiguous host tensor's memory (either kind: worker/tensors.py)."""
    return kind_of(t).raw(t)


class EntryState(enum.Enum):
    """Where a tensor's set-up stands. NEW -> ASSIGNING (the scheduler places its partitions) -> INITING
    (every partition's INIT, a per-key barrier across workers) -> READY; FAILED is final (its error is
    raised by every later call). A moved server (elastic) sends a READY entry back to INITING."""

    NEW = "new"
    ASSIGNING = "assigning"
    INITING = "initing"
    READY = "ready"
    FAILED = "failed"


NEW, ASSIGNING, INITING, READY, FAILED = (EntryState.NEW, EntryState.ASSIGNING, EntryState.INITING,
                                          EntryState.READY, EntryState.FAILED)


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
    completed: int = 0    # backup workers: the highest round its server said had completed
    shm: object = None    # its key's shared-memory region (pushpull.transport.shm), when its server gave one
    shm_push: object = None  # this rank's slot in it
    moved: bool = False   # it moved to another server (elastic) and is declared there next, with its seed (until acked)


@dataclass
class Entry:
    """What this worker knows about one named tensor."""

    name: str
    shape: tuple
    dtype: dtypes.DType
    compression: dict | None
    parts: list[Partition]
    busy: bool = False
    busy_gen: int = 0       # the job's generation its op in flight (busy) was submitted in
    state: EntryState = NEW
    error: str | None = None
    round: int = 0
    waiting: list = field(default_factory=list)  # ops queued until the entry is ready
    pending_inits: int = 0
    itemsize: int = 1
    code: int = 0           # wire dtype code
    spec: KeySpec = PLAIN
    direct_header: object = None  # the direct path's PUSH header, reused call after call (DirectCalls.push_pull_now)
    assigned: int | None = None  # its tensor key, once the scheduler placed it (told to a scheduler taking over)
    # a change of the job (elastic) left INITs to send again (pending ones, or moved partitions): sent by its next
    # op, so that only the ranks that use it declare it (a rank that came in later may never have)
    declare_later: bool = False

    def assign_request(self) -> dict:
        """What the scheduler places it by (an ASSIGN's body; the same names tell a scheduler that takes the
        job over where it lives)."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.name,
                "parts": [p.nbytes for p in self.parts],
                **({"writers": list(self.spec.writers)} if self.spec.writers is not None else {}),
                # its server holds state beyond a round (pushpull.cluster.assign.Assigner.add_server)
                **({"keeps_state": True} if self.spec.op in ("outer", "store") else {})}


class Op:
    """One push_pull call in flight (a plain class with slots: one is built per tensor per step)."""

    __slots__ = ("handle", "entry", "inp", "out", "out_bytes", "average", "priority", "round", "remaining",
                 "device", "user_out", "t_submit", "finished", "sig", "reader", "offset", "gen", "counts", "kind",
                 "active")

    def __init__(self, handle: Handle, entry: Entry, inp: np.ndarray, out, out_bytes: np.ndarray | None,
                 average: bool, priority: int, device=None, user_out=None, sig: int = 0, reader: bool = True,
                 offset: int = 0, kind=None):
        self.handle = handle
        self.entry = entry
        self.inp = inp              # raw bytes of the input (contiguous CPU)
        self.out = out              # host output tensor (of ``kind``)
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
        self.gen = 0                # the membership generation it was submitted in (elastic training)
        self.kind = kind            # its tensors' kind (worker/tensors.py): copies back to a device or user_out
        self.active = False         # counted in the pipeline's time with something in flight (metrics)


class TensorTable:
    """Every tensor this worker has used, by name. Callers' threads add entries (under ``lock``); the
    I/O thread moves their state."""

    def __init__(self):
        self.entries: dict[str, Entry] = {}
        self.lock = threading.Lock()
        # the state of keys only a server holds, as this worker last saw it, by name: (round id, parameters,
        # momentum or None), flat arrays in the accumulation dtype, never written after they are set. An
        # outer key's is advanced on the I/O thread as each round's answer arrives (advance_seed); a store
        # key's is its last pull (pushpull.torch.asynchronous). A partition that moves to another server (its
        # server was lost) is declared there with its slice, and the new server starts from the newest seed
        # it is given (pushpull.server.declare). Kept only in elastic jobs (``keep_seeds``)
        self.seeds: dict[str, tuple] = {}
        self.keep_seeds = False

    def advance_seed(self, e: Entry, rid: int, out_bytes: np.ndarray) -> None:
        """Outer key ``e``'s round ``rid`` answered ``out_bytes`` (the new global parameters): its seed moves to
        them, with the servers' momentum inferred from the step they took (pushpull.outer.momentum_after).
        On the I/O thread, as the answer arrives, so a seed never lags an answer a worker already holds.
        Exact for float32 and float64 parameters; a straggler answered past a round's deadline may skip
        rounds, and its momentum then errs (its seed is older than the others', which the server prefers)."""
        from pushpull.outer import momentum_after

        wire = out_bytes.view(e.dtype.np_wire)
        glob = (dtypes.widen_bf16(wire) if e.dtype.name == "bfloat16"
                else wire.astype(e.dtype.np_acc))  # a copy: the output is the caller's
        old = self.seeds.get(e.name)
        momentum = None
        if old is not None:
            momentum = old[2]
            if not np.array_equal(old[1], glob):  # equal: the round had no push to step on
                meta = dict(e.spec.meta or ())
                momentum = momentum_after((old[1] - glob) / glob.dtype.type(meta["outer_lr"]), momentum,
                                          meta["outer_momentum"], meta["nesterov"])
        self.seeds[e.name] = (rid, glob, momentum)

    def entry(self, name: str, shape: tuple, dtype: dtypes.DType, compression: dict | None, spec: KeySpec,
              cfg) -> Entry:
        """Stage 1, partition: the entry of ``name``, made on first use (cut into partitions of at most
        ``cfg.partition_bytes``, whole elements each, with its compression chosen), with the lock held. The
        sizes are read at first use only (a strategy's later partition size applies to new tensors; and a
        config read costs a method call, paid per tensor per step otherwise)."""
        e = self.entries.get(name)
        if e is not None:
            if e.shape != shape or e.dtype is not dtype:
                raise ValueError(f"tensor {name!r} was used as {e.dtype.name}{list(e.shape)} and is now "
                                 f"{dtype.name}{list(shape)}; give different tensors different names")
            if e.spec != spec:
                raise ValueError(f"tensor {name!r} was used as {describe_spec(e.spec)} and is now "
                                 f"{describe_spec(spec)}; give different operations different names")
            return e
        itemsize = dtype.itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        parts, off = [], 0
        for i, size in enumerate(key_sizes(nbytes, cfg.partition_bytes, itemsize, max_partition_bytes(cfg))):
            parts.append(Partition(i, off, size))
            off += size
        if compression:
            try:
                from pushpull.compression import for_tensor  # min-size and momentum policy: compression/
            except ModuleNotFoundError as ex:  # the compressors are written in torch
                if ex.name != "torch":
                    raise
                raise ValueError(f"tensor {name!r}: compression {compression!r} needs torch, which is not "
                                 f"installed ({ex}); pip install pushpull[torch], or pass no compression") from None

            try:
                use_compression = for_tensor(compression, nbytes, dtype.floating,
                                             cfg.min_compress_bytes)
            except (ValueError, TypeError) as ex:
                raise ValueError(f"tensor {name!r}: bad compression {compression!r}: {ex}") from None
        else:
            use_compression = None
        if spec.op not in ("sum", "outer") and use_compression is not None:  # outer: the pushes are summed
            raise ValueError(f"tensor {name!r}: compression needs a sum on the servers, not {spec.op}")
        e = Entry(name, shape, dtype, use_compression, parts, itemsize=itemsize,
                  code=dtype_code(dtype.name), spec=spec)
        self.entries[name] = e
        return e
