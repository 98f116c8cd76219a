"""The keys' declarations: a key exists on a server once its workers agree on what it is.

INIT (the first push of a key, which doubles as a barrier) carries the tensor's name, length, dtype,
compression, reduction and the ranks that push and receive it. Once every worker (or every declared writer)
has declared a key, and the declarations agree, the key is created (:class:`KeyState`), with its shared-memory
region for the workers on this host (:mod:`pushpull.transport.shm`); otherwise every declaring rank gets an
ERROR naming the ranks and what each declared.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from pushpull import dtypes
from pushpull.config import Config
from pushpull.outer import OuterSGD, round_deadline, settings
from pushpull.server.keystate import KeyState
from pushpull.server.reduce import ACC_NP
from pushpull.server.members import Members
from pushpull.transport import shm
from pushpull.transport.protocol import Header, Msg, MsgType, decode_json, dtype_name, encode_json, frame_view

# keys up to this size are summed on the I/O thread even with engine threads: queueing a push for
# another thread and waking it costs more than adding a few thousand numbers
INLINE_KEY_BYTES = 65536
log = logging.getLogger(__name__)
OPS = ("sum", "min", "max", "product", "concat", "store", "outer")


class Declarations:
    """The declarations pending and the creation of keys (on the I/O thread). It exists because creating a key
    is an agreement among the workers, with its own state (who declared what, since when), its own deadline and
    its own error texts, done once per key; the serving (pushpull.server.server) starts where this ends, with a
    key in ``keys``."""

    def __init__(self, cfg: Config, members: Members, keys: dict[int, KeyState], regions: shm.Regions | None,
                 reply: Callable, error: Callable):
        self.cfg = cfg
        self.members = members
        self.keys = keys  # the server's keys: this adds each once its workers agree on it
        self.regions = regions  # shared memory for the workers on this host (None: not here)
        self.pending: dict[int, dict] = {}  # key -> {"since": t, "by": {rank: (identity, req_id, decl)}}
        # partitions the changes moved here (their server was lost, or this one replaces it) and not declared here
        # since: the only keys a declaration may bring a seed for, so one rank cannot make this server hold seeds
        # at will
        self.moved_here: set[int] = set()
        # key -> (compression state, commit, generation): a load (CODEC_STATE) for a key a change moved here and not
        # declared yet, taken at its declaration; cleared at a change
        self.codec_states: dict[int, tuple[bytes, int, int]] = {}
        self._reply = reply
        self._error = error

    def expected(self, pend: dict) -> set[int]:
        """The ranks a pending key waits for: its declared writers, or every worker."""
        writers = _first(pend).get("writers")
        return set(writers) if writers is not None else set(range(self.members.num_workers))

    def init(self, identity: bytes, msg: Msg) -> None:
        h = msg.header
        req = decode_json(msg.body())
        rank = h.sender
        num_workers = self.members.num_workers
        decl = {"name": str(req.get("name")), "numel": int(h.numel), "dtype": dtype_name(h.dtype),
                "compression": req.get("compression"), "op": str(req.get("op") or "sum"),
                "readers": req.get("readers"), "kind": req.get("kind"), "meta": req.get("meta"),
                "writers": req.get("writers"), "shm": req.get("shm") is True}
        if decl["op"] not in OPS or (
                decl["readers"] is not None and not all(isinstance(r, int) for r in decl["readers"])):
            self._error(identity, h.key, f"tensor {decl['name']!r}: op {decl['op']!r} / readers "
                                         f"{decl['readers']!r} not understood", h.req_id)
            return
        writers = decl["writers"]
        if writers is not None and not (isinstance(writers, list) and writers and len(set(writers)) == len(writers)
                                        and all(type(r) is int and 0 <= r < num_workers for r in writers)
                                        and rank in writers):
            self._error(identity, h.key, f"tensor {decl['name']!r}: rank {rank} declared writers {writers!r}: "
                                         f"expected a list of distinct ranks below {num_workers} that "
                                         f"includes the declaring rank", h.req_id)
            return
        ks = self.keys.get(h.key)
        if ks is not None:  # already initialised: a consistent re-init is answered at once
            if (ks.name, ks.numel, ks.dtype, ks.op) == (decl["name"], decl["numel"], decl["dtype"], decl["op"]):
                self._reply(identity, Header(MsgType.INIT_ACK, key=h.key, req_id=h.req_id))
            else:
                self._error(identity, h.key, f"tensor {decl['name']!r} re-declared by rank {rank} as "
                                             f"{decl['dtype']}[{decl['numel']}], it is {ks.dtype}[{ks.numel}]",
                            h.req_id)
            return
        if h.key not in self.pending and len(self.keys) + len(self.pending) >= self.cfg.server_max_keys:
            self._error(identity, h.key, f"this server holds PUSHPULL_SERVER_MAX_KEYS={self.cfg.server_max_keys} "
                                         f"keys already; INIT of key {h.key} refused", h.req_id)
            return
        try:
            if req.get("seed") is not None and h.key not in self.moved_here:
                raise ValueError(f"key {h.key} did not move to this server")
            seed = _seed(req.get("seed"), msg.frames[1:], decl)
        except ValueError as e:
            self._error(identity, h.key, f"tensor {decl['name']!r}: rank {rank}'s seed: {e}", h.req_id)
            return
        pend = self.pending.setdefault(h.key, {"since": time.monotonic(), "by": {}})
        pend["by"][rank] = (identity, h.req_id, decl)
        if seed is not None and (pend.get("seed") is None or seed[0] > pend["seed"][0]):
            pend["seed"] = seed  # the newest only: what one key's seeds hold here is bounded by one
        self.complete(h.key, pend)

    def complete(self, key: int, pend: dict) -> None:
        """Create the key once every worker (but those that joined: they declare nothing) declared it, and
        the declarations agree."""
        if not self.expected(pend) <= set(pend["by"]) | self.members.joined:
            return
        del self.pending[key]
        decl = _first(pend)
        variants: dict[str, list[int]] = {}
        for r, (_, _, d) in sorted(pend["by"].items()):
            variants.setdefault(_signature(d), []).append(r)
        if len(variants) > 1:
            detail = "; ".join(f"rank(s) {rs}: {sig}" for sig, rs in variants.items())
            self._fail(key, pend, f"tensor {decl['name']!r} (key {key}) differs across workers: {detail}")
            return
        ks = self._create(key, decl, pend)
        if ks is None:
            return
        self._share(ks, pend)
        self.keys[key] = ks
        self.moved_here.discard(key)
        for r, (ident, req_id, _) in pend["by"].items():
            body = [encode_json({"shm": ks.shm.describe(ks.shm_slot[r])})] if r in ks.shm_slot else []
            self._reply(ident, Header(MsgType.INIT_ACK, key=key, req_id=req_id), body)

    def _fail(self, key: int, pend: dict, text: str) -> None:
        for ident, req_id, _ in pend["by"].values():
            self._error(ident, key, text, req_id)

    def _create(self, key: int, decl: dict, pend: dict) -> KeyState | None:
        """The key the workers agreed on, or None when the server cannot hold it (every declaring rank is told)."""
        num_workers = self.members.num_workers
        ks = KeyState(key, decl["name"], decl["dtype"], decl["numel"], num_workers, decl["compression"])
        ks.joined = self.members.joined
        ks.needs_every_rank = decl.get("kind") == "broadcast"
        backup = (decl["meta"] or {}).get("backup_workers", 0)
        if backup:
            problem = backup_problem(backup, decl, num_workers)
            if problem:
                self._fail(key, pend, problem)
                return None
            ks.use_backup(int(backup), self.cfg.backup_rounds)
        ks.inline = ks.wire_nbytes <= INLINE_KEY_BYTES
        ks.op = decl["op"]
        ks.readers = frozenset(decl["readers"]) if decl["readers"] is not None else None
        ks.writers = frozenset(decl["writers"]) if decl.get("writers") is not None else None
        if decl["compression"]:
            try:
                from pushpull.server.codec import ServerCodec

                ks.codec = ServerCodec(decl["compression"], decl["dtype"], decl["numel"], key=key)
            except Exception as e:  # a bad spec is the workers' error, not a server crash
                self._fail(key, pend, f"tensor {decl['name']!r}: compression {decl['compression']} "
                                      f"rejected by the server: {e}")
                return None
            kept = self.codec_states.pop(key, None)
            if kept is not None:  # moved here after a change: the commit's state, which a worker loaded before this
                try:
                    ks.codec.load(*kept)
                except Exception as e:  # noqa: BLE001 - a worker's bad copy must not keep the key from existing
                    log.error("tensor %r: the compression state loaded for it does not fit it (%s); it starts "
                              "from zero", decl["name"], e)
        if ks.op == "outer":  # DiLoCo / local SGD: the servers keep the global parameters and step them
            problem = outer_problem(decl)
            if problem:
                self._fail(key, pend, problem)
                return None
            ks.outer = OuterSGD(**settings(decl["meta"] or {}), dtype=ACC_NP[decl["dtype"]])
            ks.outer_deadline = round_deadline(decl["meta"] or {})
            if pend.get("seed") is not None:  # moved here from a lost server: the workers' copy of its state
                ks.reseed(*pend["seed"])
        if ks.op == "store":  # asynchronous training: the servers keep the parameters
            ks.store = np.zeros(decl["numel"], dtype=ACC_NP[decl["dtype"]])
            if pend.get("seed") is not None:  # moved here from a lost server: the newest copy a worker pulled
                ks.store = pend["seed"][1]
        return ks

    def _share(self, ks: KeyState, pend: dict) -> None:
        """Give the new key a shared-memory region, with a slot for each rank that offered one, if it can have it."""
        offered = sorted(r for r, (_, _, d) in pend["by"].items() if d.get("shm"))
        if offered and self.shares_memory(ks):
            ks.shm = self.regions.create(ks.key, ks.wire_nbytes, len(offered))
            if ks.shm is not None:
                ks.shm_slot = {r: i for i, r in enumerate(offered)}
                ks.shm_unseen = set(offered) - self.members.joined  # a rank that joined since it declared won't push
                if not ks.shm_unseen:
                    self.regions.unlinked(ks.key)

    def shares_memory(self, ks: KeyState) -> bool:
        """Whether a key's payloads can go through shared memory (PUSHPULL_LOCAL_SHM; pushpull.transport.shm):
        a plain reduction of whole, uncompressed pushes by every worker, answered to every worker, in rounds
        that each rank pushes once and pulls once."""
        return (self.regions is not None and ks.op in ("sum", "min", "max", "product") and ks.codec is None
                and not ks.backup and ks.store is None and ks.readers is None and ks.writers is None
                and shm.MIN_KEY_BYTES < ks.wire_nbytes <= self.cfg.max_message_bytes)

    def pushed_once(self, ks: KeyState, rank: int) -> None:
        """Rank ``rank`` pushed ``ks`` (or joined): it has mapped the key's region or given up on it, so once every
        rank it was offered to has, its file is unlinked (the mappings stay)."""
        if rank in ks.shm_unseen:
            ks.shm_unseen.discard(rank)
            if not ks.shm_unseen:
                self.regions.unlinked(ks.key)

    def stop_sharing(self, ks: KeyState) -> None:
        """The workers changed: the key's slots belong to the ranks of before, so it goes by the socket from now."""
        ks.stop_sharing()
        self.regions.unlinked(ks.key)

    def joined(self, rank: int) -> None:
        """Rank ``rank`` called join() (already in ``members.joined``): it will push nothing, so no region waits
        for it, and the declarations that only waited for it complete now."""
        for ks in self.keys.values():  # it will not push: its region's file need not wait for it
            self.pushed_once(ks, rank)
        for key, pend in list(self.pending.items()):
            self.complete(key, pend)

    def check_timeouts(self) -> None:
        """Fail the declarations some rank has not made within the timeout, naming those ranks."""
        now = time.monotonic()
        for key, pend in list(self.pending.items()):
            if now - pend["since"] > self.cfg.timeout:
                missing = sorted(self.expected(pend) - set(pend["by"]))
                name = _first(pend)["name"]
                self._fail(key, pend, f"tensor {name!r}: rank(s) {missing} never declared it within "
                                      f"{self.cfg.timeout:.0f}s (ranks {sorted(pend['by'])} did); do all workers "
                                      f"push_pull the same tensors?")
                del self.pending[key]


def _first(pend: dict) -> dict:
    """The first declaration of a pending key."""
    return next(iter(pend["by"].values()))[2]


def _signature(d: dict) -> str:
    """What a declaration says, as the workers must all say it (compared to tell whether they agree)."""
    sig = f"{d['dtype']}[{d['numel']}] compression={d['compression']}"
    sig += f" op={d['op']}"
    if d["kind"] not in (None, "allreduce"):
        sig += f" ({d['kind']})"
    if d["readers"] is not None:
        sig += f" received by {d['readers']}"
    if d.get("writers") is not None:
        sig += f" pushed by {sorted(d['writers'])}"
    for k, v in sorted((d["meta"] or {}).items()):
        sig += f" {k}={v}"
    return sig


def _seed(spec, frames: list, decl: dict) -> tuple | None:
    """An INIT's seed: (round id, global parameters, momentum or None) in the key's accumulation dtype, checked
    against the declaration (ValueError saying what is wrong), or None when it has none."""
    if spec is None:
        return None
    if decl["op"] not in ("outer", "store") or not isinstance(spec, dict):
        raise ValueError("only an outer or store key takes a seed, as {'round': id, 'momentum': true|false}")
    rid, has_momentum = spec.get("round"), spec.get("momentum")
    if type(rid) is not int or rid < 1 or not isinstance(has_momentum, bool):
        raise ValueError(f"round {rid!r} must be an integer >= 1 and momentum {has_momentum!r} true or false")
    if not dtypes.get(decl["dtype"]).floating:
        raise ValueError(f"a seed is floating-point parameters, not {decl['dtype']}")
    if has_momentum and decl["op"] != "outer":
        raise ValueError("only an outer key has momentum")
    acc = np.dtype(ACC_NP[decl["dtype"]])
    if len(frames) != 1 + has_momentum:
        raise ValueError(f"{len(frames)} frame(s), {1 + has_momentum} expected")
    arrays = []
    for f in frames:
        buf = frame_view(f)
        if buf.nbytes != decl["numel"] * acc.itemsize:
            raise ValueError(f"{buf.nbytes} bytes, {decl['numel']} x {acc.itemsize} expected")
        arrays.append(np.frombuffer(buf, dtype=acc).copy())
    return rid, arrays[0], arrays[1] if has_momentum else None


def outer_problem(decl: dict) -> str | None:
    """Why an outer key (pushpull.outer) cannot be created, or None."""
    name = decl["name"]
    if not dtypes.get(decl["dtype"]).floating:
        return f"tensor {name!r}: the outer optimizer needs floating-point parameters, got {decl['dtype']}"
    try:
        settings(decl["meta"] or {})
        round_deadline(decl["meta"] or {})
    except ValueError as e:
        return f"tensor {name!r}: {e}"
    return None


def backup_problem(backup, decl: dict, num_workers: int) -> str | None:
    """Why a key cannot have ``backup`` backup workers among ``num_workers`` (None: it can)."""
    if not isinstance(backup, int) or not 0 < backup < num_workers:
        return (f"tensor {decl['name']!r}: PUSHPULL_BACKUP_WORKERS={backup!r} must be an integer from 0 to "
                f"{num_workers - 1} with {num_workers} workers")
    if decl["op"] != "sum" or decl["compression"]:
        return (f"tensor {decl['name']!r}: backup workers need a plain sum (op {decl['op']!r}, compression "
                f"{decl['compression']!r} asked)")
    if decl.get("writers") is not None:
        return (f"tensor {decl['name']!r}: backup workers and the local reduce (PUSHPULL_LOCAL_REDUCE) do not "
                f"combine: a round that completes without a machine would leave its local peers without "
                f"their slice; set PUSHPULL_LOCAL_REDUCE=0 to use PUSHPULL_BACKUP_WORKERS={backup}")
    return None
