"""Elastic training: a job that goes on when a worker dies, in the shape of Horovod Elastic's API
(``State.commit``/``restore``/``sync`` and a ``run`` decorator).

Why a commit/restore API rather than transparent recovery: when a worker dies mid-step, the survivors
may each have applied a different number of updates of that step (some had their averaged gradients,
some not). Rolling every survivor back to the last state they all committed, then copying rank 0's,
makes them identical again at a known point; the training function then resumes from there.

How (PUSHPULL_MIN_WORKERS or ``pushpull launch --min-workers M``): the scheduler notices the dead
worker from its closed connection (or heartbeats), renumbers the survivors 0..n'-1, tells the servers
(which drop every round in flight and expect n' pushes) and then the workers, whose operations in
flight raise :class:`WorkersChanged`. :func:`run` catches it, restores the last commit, resets the
optimizers, calls the reset callbacks (re-shard data from ``size()``/``rank()`` there, or read them
again at the top of the epoch) and syncs from the new rank 0.

    state = elastic.TorchState(model, optimizer, epoch=0)

    @elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...  # one epoch, sharded by bps.rank() / bps.size() read here
            state.commit()

    train(state)

Under ``torchrun --nnodes MIN:MAX`` (or any launcher that restarts every worker on a change), the processes
that held the commit in memory are all ended and started again; :func:`run` then resumes from the newest commit
a node kept on its disk (PUSHPULL_ELASTIC_DIR, on by default under torchrun with ``--max-restarts`` > 0).
"""
from __future__ import annotations

import copy
import functools
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Callable

import torch

from pushpull.config import read_setting
from pushpull.torch import functions, ops
from pushpull.worker import codec_state
from pushpull.worker.handle import PushPullError, WorkersChanged

log = logging.getLogger("pushpull.elastic")

__all__ = ["Keeper", "State", "TorchState", "WorkersChanged", "run"]


class State:
    """Named values (``state.epoch``, ``state.batch``, ...) that survive a change of workers: ``commit()``
    keeps a copy, ``restore()`` goes back to it, ``sync()`` makes every worker's equal to rank 0's."""

    def __init__(self, **values):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_saved", copy.deepcopy(values))
        object.__setattr__(self, "_callbacks", [])
        object.__setattr__(self, "resets", 0)
        object.__setattr__(self, "_commits", 0)  # commits so far in the job (across restarts: the newest wins)
        object.__setattr__(self, "_names", sorted(values))  # the values it was made with (its fingerprint)
        object.__setattr__(self, "_keeper", None)  # this node's copy on disk (run() sets it, PUSHPULL_ELASTIC_DIR)

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        if name in self.__dict__ or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._values[name] = value

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Called after each change of workers, once the state is restored and before it is synced."""
        self._callbacks.extend(callbacks)

    def commit(self) -> None:
        self._promote(self._copy())

    def _copy(self) -> dict:
        """A copy of the state as it is now."""
        return {"values": copy.deepcopy(self._values)}

    def _promote(self, kept: dict) -> None:
        """Make ``kept`` (a :meth:`_copy`) the last commit: the one restore() goes back to, counted, on disk."""
        self._install(kept)
        self.__dict__["_commits"] += 1
        if self._keeper is not None:
            self._keeper.save(self._commits, self._fingerprint(), self._payload())

    def _install(self, kept: dict) -> None:
        self.__dict__["_saved"] = kept["values"]

    def _payload(self) -> dict:
        """The last commit, as it goes to disk."""
        return {"values": self._saved}

    def _fingerprint(self) -> str:
        """What a commit on disk must match to be this job's: the names of the values the state was made with
        (and, for a TorchState, the model's tensors and shapes and the optimizer's), so that another job's file is
        never taken for it."""
        return "values:" + ",".join(self._names)

    def take(self, payload: dict) -> None:
        """Make a commit kept on disk this worker's state (and its last commit)."""
        self._values.clear()
        self._values.update(payload["values"])
        self.__dict__["_saved"] = copy.deepcopy(self._values)

    def restore(self) -> None:
        self._values.clear()
        self._values.update(copy.deepcopy(self._saved))

    def sync(self, root_rank: int = 0) -> None:
        """Every worker takes ``root_rank``'s values (JSON-able values travel as JSON, tensors as tensors)."""
        if ops.engine() is not None:
            self._values.update(functions.broadcast_object(dict(self._values), root_rank=root_rank,
                                                           name="elastic.state"))

    def on_reset(self) -> None:
        for fn in self._callbacks:
            fn()


class TorchState(State):
    """A model's parameters and buffers and an optimizer's state, besides named values. The optimizer's
    step in progress is dropped on a reset (``DistributedOptimizer.reset``). The model's
    :class:`pushpull.torch.SparseEmbedding` tables are committed and restored with it: their rows live on the
    servers, and the workers keep a copy as of the last commit (docs/sparse.md). That copy streams over the
    steps after ``commit()`` (at most PUSHPULL_SPARSE_COPY_STEPS); the commit is the one a change goes back to
    once it is complete (until then, the one before). The compression state (the workers' error feedback and
    momentum, the servers' error feedback) is committed and restored with it (pushpull.worker.codec_state)."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **values):
        super().__init__(**values)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "_model_saved", None)
        object.__setattr__(self, "_opt_saved", None)
        object.__setattr__(self, "_pending", None)  # a commit whose sparse tables' copies stream: (copy, tables)
        object.__setattr__(self, "_codecs_saved", None)  # the compression state of the last commit
        object.__setattr__(self, "_codecs_to_load", None)  # ... which the servers get back at the next sync
        self._install(self._copy())

    def _copy(self) -> dict:
        kept = super()._copy()
        if self.model is not None:
            kept["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.optimizer is not None:
            kept["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
        eng = ops.engine()
        if eng is not None:
            kept["codecs"] = codec_state.commit(eng, self._commits + 1, self._codecs_saved)
        return kept

    def _install(self, kept: dict) -> None:
        super()._install(kept)
        self.__dict__["_model_saved"] = kept.get("model")
        self.__dict__["_opt_saved"] = kept.get("optimizer")
        self.__dict__["_codecs_saved"] = kept.get("codecs")

    def _sparse(self) -> list:
        from pushpull.torch.sparse import SparseEmbedding

        return [m for m in self.model.modules() if isinstance(m, SparseEmbedding)] if self.model is not None else []

    def commit(self) -> None:
        """Keep a copy of the state; with sparse tables whose rows changed since the last commit, it becomes the
        last commit once every worker's copy of their changed rows has streamed in (class docstring)."""
        tables = [m for m in self._sparse() if m.elastic]
        if not tables:
            return super().commit()
        self._copied()  # the commit before, if its tables' copies still stream: now, and it is the last one
        kept = self._copy()
        changed = [m for m in tables if m.changed_since_copy()]  # every worker gets the same list
        steps = self._copy_steps(changed) if changed else 0
        for m in tables:
            m.commit(self._commits + 1, steps)
        if not changed:  # no round since the last commit: the copies are this one's already, once all know it (a
            # worker a change stops before it holds the commit as a delta, which its copy serves)
            ops.push_pull(torch.zeros(1), average=False, name="elastic.sparse.committed")
            for m in tables:
                m.committed()
            return self._promote(kept)
        self.__dict__["_pending"] = (kept, tables)
        for m in changed:
            m.on_copied = self._table_copied
        if not steps:
            self._copied()

    @staticmethod
    def _copy_steps(changed: list) -> int:
        """The steps the copies take, the same on every worker: the slowest worker's pace (half the bytes it pushes
        per step), within the smallest PUSHPULL_SPARSE_COPY_STEPS any worker has (0 on any: at once)."""
        n, cap = ops.size(), ops.engine().cfg.sparse_copy_steps
        mine = torch.zeros(2, n, dtype=torch.int64)
        mine[0, ops.rank()] = max(m.copy_steps_wanted() for m in changed) or cap
        mine[1, ops.rank()] = cap
        want, caps = ops.push_pull(mine, average=False, name=f"elastic.sparse.copy_steps.n{n}")
        cap = int(caps.min())
        return min(cap, int(want.max())) if cap else 0

    def finish_commit(self) -> None:
        """Read the rest of the last ``commit()``'s sparse copies now, so that it is the commit a change goes back
        to when this returns (collective: every worker calls it at the same point; a commit without sparse tables
        is complete already). Before a planned stop or a measurement."""
        self._copied()

    def _table_copied(self) -> None:
        """A table's step ended its copy's steps: the commit's copies end once every table's has (the tables
        step in the same order on every worker, so every worker gets here at the same step)."""
        if self._pending is not None and all(m.copy_steps_done() for m in self._pending[1]):
            self._copied()

    def _copied(self) -> None:
        """Read the rest of the pending commit's copies; once every worker has (a barrier), every copy takes its
        rows and the commit becomes the last one."""
        if self._pending is None:
            return
        kept, tables = self._pending
        for m in tables:
            m.finish_copy()
        ops.push_pull(torch.zeros(1), average=False, name="elastic.sparse.committed")
        for m in tables:
            m.committed()
        self.__dict__["_pending"] = None
        self._promote(kept)

    def _payload(self) -> dict:
        return {"values": self._saved, "model": self._model_saved, "optimizer": self._opt_saved}

    def _fingerprint(self) -> str:
        shapes = ";".join(f"{k}:{list(v.shape)}" for k, v in self.model.state_dict().items()) if self.model else ""
        groups = [len(g["params"]) for g in self.optimizer.param_groups] if self.optimizer is not None else []
        return f"{super()._fingerprint()} model:{shapes} optimizer:{type(self.optimizer).__name__}{groups}"

    def take(self, payload: dict) -> None:
        super().take(payload)
        if self.model is not None and payload.get("model") is not None:
            self.model.load_state_dict(payload["model"])
        if self.optimizer is not None and payload.get("optimizer") is not None:
            self.optimizer.load_state_dict(payload["optimizer"])
        self._install(self._copy())

    def restore(self) -> None:
        """Back to the last commit (a commit whose copies were still streaming is not it: it is dropped)."""
        self.__dict__["_pending"] = None
        for m in self._sparse():
            m.drop_copy()
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None:
            if hasattr(self.optimizer, "reset"):
                self.optimizer.reset()
            if self._opt_saved is not None:
                self.optimizer.load_state_dict(copy.deepcopy(self._opt_saved))
        eng = ops.engine()
        if eng is not None:
            codec_state.restore(eng, self._codecs_saved)
            self.__dict__["_codecs_to_load"] = self._codecs_saved

    def sync(self, root_rank: int = 0) -> None:
        eng = ops.engine()
        if eng is not None and self._codecs_to_load is not None:  # after a restore, before anyone steps again
            try:
                codec_state.load_servers(eng, self._codecs_to_load)
            except WorkersChanged:
                raise
            except PushPullError as e:  # the job goes on, those residuals from zero: not a reason to end it
                log.error("elastic.run: the servers' compression state could not be loaded back for every tensor (%s); "
                          "the error feedback of those refused starts again from zero", e)
            self.__dict__["_codecs_to_load"] = None
        super().sync(root_rank)
        if eng is None:
            return
        if self.model is not None:
            functions.broadcast_parameters(self.model.state_dict(), root_rank=root_rank, prefix="elastic.model.")
        if self.optimizer is not None:
            functions.broadcast_optimizer_state(self.optimizer, root_rank=root_rank, prefix="elastic.opt.")
        for m in self._sparse():  # after a change: the tables as of the commit the job goes back to
            m.resume(self._commits)


class Keeper:
    """This node's copy of the last commit, in one file (PUSHPULL_ELASTIC_DIR). Why: ``torchrun --nnodes
    MIN:MAX`` ends every worker when a node leaves or joins and starts them all again, so the commit they held in
    memory is gone; the node's disk keeps it. One writer per node (its local rank 0: every rank's commit is the
    same), replaced atomically at each commit, read back with ``torch.load(weights_only=True)`` (no code runs)."""

    FILE = "commit.pt"

    def __init__(self, folder: Path, writer: bool, owner: str | None = None):
        """``owner``: the torchrun agent this node's commits belong to (its pid and start time), or None (any)."""
        self.folder = folder
        self.writer = writer
        self.owner = owner
        self.path = folder / self.FILE

    @classmethod
    def from_env(cls, env=os.environ, writer: bool | None = None) -> "Keeper | None":
        """PUSHPULL_ELASTIC_DIR's folder ('off': none); unset, a private folder per run under torchrun with
        --max-restarts > 0, else none. ``writer`` (default: whether this is its node's local rank 0) keeps it."""
        folder, _ = read_setting("elastic_dir", env)
        private = False
        # (torchrun's default --rdzv-id is 'none': every such job would share the folder)
        if folder is None and env.get("TORCHELASTIC_RUN_ID", "none") != "none" \
                and int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
            run_id = re.sub(r"[^A-Za-z0-9_.-]", "_", env["TORCHELASTIC_RUN_ID"])
            folder, private = os.path.join(tempfile.gettempdir(), f"pushpull-elastic-{os.getuid()}-{run_id}"), True
        if folder is None or folder == "off":
            return None
        path = Path(folder)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
        if private and (st.st_uid != os.getuid() or st.st_mode & 0o077 or not path.is_dir() or path.is_symlink()):
            raise RuntimeError(f"elastic.run: {path} (where this node keeps its last commit) is not this user's "
                               f"private folder (owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)}): another "
                               f"user could give this job its state; remove it, or set PUSHPULL_ELASTIC_DIR")
        # in the default folder a commit belongs to this node's torchrun agent, which lives through every round of
        # the run: a later run under the same --rdzv-id (a new agent) starts afresh instead of resuming it
        keeper = cls(path, ops.local_rank() == 0 if writer is None else writer, _agent() if private else None)
        if keeper.writer:  # a worker killed while it wrote left its part-written file
            for stale in path.glob(f".{cls.FILE}.*"):
                stale.unlink(missing_ok=True)
        return keeper

    def save(self, commits: int, fingerprint: str, payload: dict) -> None:
        if not self.writer:
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{self.FILE}.", dir=self.folder)  # 0600, a name of its own
        with os.fdopen(fd, "wb") as f:
            torch.save({"commits": commits, "fingerprint": fingerprint, "owner": self.owner, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)  # whole or not at all: a worker killed mid-write leaves the last one

    def load(self, fingerprint: str | None = None) -> dict | None:
        """The commit this node kept (None: none, not this job's (its ``fingerprint`` differs), or this process
        is not the node's writer)."""
        if not self.writer or not self.path.exists():
            return None
        try:
            kept = torch.load(self.path, map_location="cpu", weights_only=True)
            int(kept["commits"]), kept["values"]
        except Exception as e:  # noqa: BLE001 - any unreadable file: set aside, so that no restart reads it again
            aside = self.path.with_name(self.FILE + ".unreadable")
            os.replace(self.path, aside)
            log.error("elastic.run: the commit kept in %s cannot be read (%r); set aside as %s, this node "
                      "resumes nothing", self.path, e, aside)
            return None
        if self.owner is not None and kept.get("owner") != self.owner:
            log.info("elastic.run: %s holds the commit of an earlier run under this run id; starting afresh",
                     self.path)
            return None
        if fingerprint is not None and kept.get("fingerprint") != fingerprint:
            log.warning("elastic.run: %s holds another job's commit (its model, optimizer or named values differ "
                        "from this one's); not resuming from it", self.path)
            return None
        return kept


def _agent() -> str | None:
    """This process's parent (torchrun's agent, under torchrun) as pid and start time, which no later process
    of that pid shares."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat") as f:
            return f"{ppid}:{f.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None


def _elect(state: State, kept: dict | None, where: Path | None) -> int:
    """The rank every rank syncs from: the lowest one holding the newest commit, counting each rank's in memory
    and, after a restart of every worker, the one its node kept on disk (``kept``, from ``where``), which that
    rank then takes. Every rank takes part in every sync, so all make the same calls whatever each holds (a
    newcomer holds none: the others' count wins, and rank 0 is theirs). One process alone counts its own."""
    on_disk = int(kept["commits"]) if kept is not None else 0
    n, rank = ops.size(), ops.rank()
    counts = torch.zeros(n, dtype=torch.int64)
    counts[rank] = max(state._commits, on_disk)
    if ops.engine() is not None:
        counts = ops.push_pull(counts, average=False, name=f"elastic.commits.n{n}")
    best = int(counts.max())
    root = int((counts == best).nonzero()[0]) if best else 0
    if rank == root and kept is not None and on_disk == best and on_disk > state._commits:
        state.take(kept)
        log.warning("resuming from commit %d, kept on this node (%s); %d worker(s) now", best, where, n)
    elif root != 0 and rank != root:
        log.warning("resuming from commit %d, which rank %d's node kept; %d worker(s) now", best, root, n)
    object.__setattr__(state, "_commits", best)
    return root


def run(fn: Callable) -> Callable:
    """Call ``fn(state, ...)``; each time the workers change under it (:class:`WorkersChanged`), restore
    ``state``'s last commit, run its reset callbacks, sync it from the rank holding the newest commit (rank 0,
    unless a change cut some ranks off just before one) and call ``fn`` again. The state is synced once before
    the first call, so every worker starts from the same state (after a restart of every worker, the newest
    commit a node kept on disk)."""

    @functools.wraps(fn)
    def wrapper(state: State, *args, **kwargs):
        synced = False
        keeper = Keeper.from_env()
        eng = ops.engine()
        # read from disk once, at the process's start (a worker that came into a running job, under pushpull launch
        # --restart-workers, takes the others' state as any newcomer does)
        load = keeper is not None and not (eng is not None and eng.joined_late)
        while True:
            try:
                if not synced:  # every worker from the newest state, committed: the same point to come back to
                    kept = keeper.load(state._fingerprint()) if load else None
                    root = _elect(state, kept, keeper.path if keeper is not None else None)
                    state.sync(root) if root else state.sync()
                    object.__setattr__(state, "_keeper", keeper)  # (a change before this: the file stays as it was)
                    load = False
                    state.commit()
                    synced = True
                return fn(state, *args, **kwargs)
            except WorkersChanged as e:
                object.__setattr__(state, "resets", state.resets + 1)
                log.warning("workers changed (%s); restoring the last commit and going on as rank %d of %d",
                            e, ops.rank(), ops.size())
                state.restore()
                state.on_reset()
                synced = False
    return wrapper
