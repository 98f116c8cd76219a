"""SparseEmbedding: an embedding table that lives on the parameter servers, partitioned by row ranges.

Why: a dense push_pull of an embedding's gradient moves every row every step, even when a batch
touches 1 % of them (a 1 M x 64 fp32 table: 256 MB up and 256 MB down per worker per step). Here a
lookup pulls only the rows the batch needs and ``step()`` pushes only those rows' gradients; the
servers sum them across workers, average, and apply the optimizer (SGD or Adagrad) to those rows,
so no worker holds the table or its optimizer state. Training is synchronous and matches dense
training with DistributedOptimizer (same average, same update) up to floating-point rounding.

Use::

    emb = bps.SparseEmbedding(1_000_000, 64, name="items", lr=0.1, weight=initial)  # on every worker
    out = emb(ids)             # pulls the rows of ids (after the last step's update)
    loss(out).backward()
    opt.step(); emb.step()     # the dense optimizer for the rest; emb.step() pushes the rows' gradients

Every worker must call ``step()`` once per step (possibly with no lookup since the last: it pushes
nothing but still completes the round). The learning rate is ``emb.lr`` (change it for a schedule).

Elastic jobs (PUSHPULL_MIN_WORKERS): the workers keep the table as of their last commit, cut into
``size()`` shards of rows, each shard on two workers (rank r holds shards r and r + 1), and a commit
(``elastic.TorchState.commit`` with the module in the state's model) fetches only the rows changed since
the previous one, streamed over the next steps (at most PUSHPULL_SPARSE_COPY_STEPS) from the servers'
snapshot of the commit's round (the commit counts once they are all in). A change of the workers or of the
servers drops the table on the servers; ``elastic.run`` then declares it again over the servers alive and
loads every shard from a worker holding it at the commit the job goes back to, so the table, like the model,
is the last commit's: nothing lost with a server, no round applied twice. Losing both holders of a shard
at once is an error naming the rows.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pushpull.torch import ops
from pushpull.worker.handle import PushPullError
from pushpull.worker.sparse import SparseClient, row_bounds


class _Copy:
    """This worker's copy of some rows of the table as of a commit: ranges [lo, hi) with their values (and
    Adagrad accumulators), the commit, and the server round the copy was taken at (a commit then asks for the
    rows changed since)."""

    def __init__(self, commit: int, since: int, ranges: list):
        self.commit, self.since = commit, since
        self.ranges = ranges  # [(lo, hi, rows (hi - lo, dim), accum or None)]

    def merge(self, delta: "_Copy") -> None:
        """Take the changed rows ``delta`` holds (same ranges, each (lo, hi, ids, rows, accum))."""
        for (lo, _, rows, acc), (_, _, ids, new, new_acc) in zip(self.ranges, delta.ranges):
            rows[ids - lo] = new
            if acc is not None:
                acc[ids - lo] = new_acc
        self.commit, self.since = delta.commit, delta.since


class SparseEmbedding(torch.nn.Module):
    """``torch.nn.Embedding`` whose table lives on the servers (module docstring). ``weight``: the
    table's start, taken from rank 0 (as broadcast_parameters would); None: zeros. ``optimizer``:
    ``"sgd"`` or ``"adagrad"`` (with ``eps`` and ``initial_accumulator_value``, torch.optim.Adagrad's)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str | None = None, optimizer: str = "sgd",
                 lr: float = 0.01, eps: float = 1e-10, initial_accumulator_value: float = 0.0,
                 weight: torch.Tensor | None = None):
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(f"SparseEmbedding needs num_embeddings >= 1 and embedding_dim >= 1, got "
                             f"{num_embeddings} x {embedding_dim}")
        if optimizer not in ("sgd", "adagrad"):
            raise ValueError(f"SparseEmbedding optimizer must be 'sgd' or 'adagrad', got {optimizer!r}")
        eng = ops.engine()
        if eng is None:
            raise ops.NotInitializedError("SparseEmbedding needs pushpull.torch.init() with parameter servers")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.name = name or f"sparse.{num_embeddings}x{embedding_dim}"
        self.lr = float(lr)
        spec = {"name": optimizer}
        if optimizer == "adagrad":
            spec.update(eps=float(eps), initial_accumulator_value=float(initial_accumulator_value))
        if weight is not None and tuple(weight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"SparseEmbedding {self.name!r}: weight is {list(weight.shape)}, expected "
                             f"[{self.num_embeddings}, {self.embedding_dim}]")
        self.client = SparseClient(eng, self.name, self.num_embeddings, self.embedding_dim, spec)
        self._lookups: list[tuple[torch.Tensor, torch.Tensor]] = []
        # elastic jobs: this worker's copy of its shards at the last commit, and the rows a commit in progress
        # fetched (kept apart until every worker has fetched them: see commit())
        self.elastic = bool(eng.cfg.min_workers)
        self._copy: _Copy | None = None
        self._delta: _Copy | None = None
        self._copying: int | None = None  # the commit whose changed rows stream in (client.stream)
        self._copy_stepped = 0  # steps since that commit
        self.copy_steps = 0  # the steps the last commit's copy takes (the same on every worker; 0: none streamed)
        self._pushed = [0, 0]  # bytes pushed and steps since the last commit (what a copy's pace is measured by)
        self.on_copied = None  # called at the step that ends the copy's steps (TorchState's)
        self.resumes = 0  # times the table was loaded again after a change of the job
        if eng.joined_late:  # a worker that came into the running job: elastic.run's sync loads the table
            return
        self.client.declare()
        if weight is not None and ops.rank() == 0:
            w = weight.detach().to("cpu", torch.float32).contiguous().numpy()
            self.client.load(np.arange(self.num_embeddings, dtype=np.int64), w)
        ops.barrier()  # every worker's first lookup reads the loaded table
        if self.elastic:
            self._cut(0)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        if indices.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"SparseEmbedding {self.name!r}: indices must be int64 or int32, got {indices.dtype}")
        self.client.check_generation()
        device = indices.device
        uniq, inverse = torch.unique(indices.detach().to("cpu", torch.int64).reshape(-1), return_inverse=True)
        rows = torch.from_numpy(self.client.pull(uniq.numpy())).to(device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._lookups.append((uniq, rows))
        return F.embedding(inverse.to(device).reshape(indices.shape), rows)

    @torch.no_grad()
    def step(self) -> None:
        """Push the gradients of the rows looked up since the last step (one round on every server)."""
        lookups, self._lookups = self._lookups, []  # taken once: a step a change interrupts is not pushed later
        self.client.check_generation()
        ids, grads = [], []
        for uniq, rows in lookups:
            if rows.grad is not None:
                ids.append(uniq)
                grads.append(rows.grad.to("cpu", torch.float32))
        if len(ids) > 1:  # several lookups: one gradient per row, summed as a dense embedding's would be
            all_ids = torch.cat(ids)
            uniq, inverse = torch.unique(all_ids, return_inverse=True)
            g = torch.zeros(len(uniq), self.embedding_dim).index_add_(0, inverse, torch.cat(grads))
            ids, grads = [uniq], [g]
        stream = self.client.stream
        if stream is not None:  # a commit's copy: asked for before the push (a request queued behind the push would
            # reach the servers only once the push is up), so a share of it comes down while the push goes up
            self._copy_stepped += 1
            stream.advance(-(-self._held_rows() // self.copy_steps))
        if ids:
            self.client.push(ids[0].numpy(), grads[0].contiguous().numpy(), self.lr)
        else:
            self.client.push(np.empty(0, np.int64), np.empty((0, self.embedding_dim), np.float32), self.lr)
        self._pushed[0] += len(ids[0]) * (8 + 4 * self.embedding_dim) if ids else 0
        self._pushed[1] += 1
        if stream is not None and self._copy_stepped >= self.copy_steps and self.on_copied is not None:
            self.on_copied()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the lookups since the last step (their gradients are not pushed)."""
        self._lookups = []

    @torch.no_grad()
    def table(self) -> torch.Tensor:
        """The whole table as the servers hold it after this worker's last step (checkpoints, tests)."""
        self.client.check_generation()
        self.client.flush()  # a refused push is raised here, not hidden behind the read
        return torch.from_numpy(self.client.pull(np.arange(self.num_embeddings, dtype=np.int64)))

    # ------------------------------------------------------------ elastic --
    def _shards(self) -> list[tuple[int, int]]:
        """The row ranges this worker keeps: shards rank and rank + 1 of ``size()`` (one shard alone: itself)."""
        n, r = ops.size(), ops.rank()
        bounds = row_bounds(self.num_embeddings, n)
        return [(bounds[s], bounds[s + 1]) for s in sorted({r, (r + 1) % n})]

    def _cut(self, commit: int) -> None:
        """Take this worker's shards whole from the servers (at the start, and after a change re-shards them)."""
        ranges = []
        for lo, hi in self._shards():
            ids, rows, acc = self.client.changed(lo, hi, -1)
            ranges.append((lo, hi, rows.copy(), acc.copy() if acc is not None else None))
        self._copy, self._delta = _Copy(commit, self.client.round, ranges), None

    def _held_rows(self) -> int:
        return sum(hi - lo for lo, hi, _, _ in self._copy.ranges)

    def changed_since_copy(self) -> bool:
        """Whether a round changed the table since the copy was taken (the same on every worker: rounds are
        synchronous)."""
        return self.elastic and self.client.round != self._copy.since

    def copy_steps_wanted(self) -> int:
        """The steps this worker's copy would take if each read half the bytes a step pushed on average since the
        last commit: the answers come down during the push, and half leaves it room (0: nothing was pushed)."""
        per_step = self._pushed[0] / max(self._pushed[1], 1)
        row = 8 + 4 * self.embedding_dim * (2 if self.client.optimizer["name"] == "adagrad" else 1)
        return int(np.ceil(self._held_rows() * row / (per_step / 2))) if per_step else 0

    def commit(self, commit: int, steps: int) -> None:
        """Start reading the rows of this worker's shards changed since its copy was taken (``commit``: the number
        the elastic state's commit will have) from the servers' snapshot of this round, 1/``steps`` of its rows a
        step (every worker reads for the same number of steps). With no round since the copy it is the commit's
        already. The copy takes them in :meth:`committed`, once every worker has read its own: a change in between
        leaves every copy able to serve the commit the job goes back to."""
        self.client.check_generation()
        self._pushed = [0, 0]
        if not self.changed_since_copy():
            self.copy_steps = 0
            none = np.empty((0, self.embedding_dim), np.float32)
            self._delta = _Copy(commit, self._copy.since, [(lo, hi, np.empty(0, np.int64), none, none)
                                                           for lo, hi, _, _ in self._copy.ranges])
            return
        self.client.copy([(lo, hi) for lo, hi, _, _ in self._copy.ranges], self._copy.since)
        self._copying, self._copy_stepped, self.copy_steps = commit, 0, max(1, steps)

    def copy_steps_done(self) -> bool:
        return self._copying is None or self._copy_stepped >= self.copy_steps

    def finish_copy(self) -> None:
        """Read what is left of the commit's changed rows (normally little: the steps read them)."""
        stream = self.client.stream
        if stream is None:  # no round since the last commit (commit() made the delta)
            return
        parts = stream.finish()
        ranges = [(lo, hi, *part) for (lo, hi, _, _), part in zip(self._copy.ranges, parts)]
        self._delta = _Copy(self._copying, stream.round, ranges)
        self._copying, self.on_copied = None, None

    def drop_copy(self) -> None:
        """A change interrupted the commit whose rows were streaming in: it is not the last commit (the one
        before is, which this worker's copy holds), so what came of it goes."""
        if self._copying is not None:
            self.client.stream = None
            self._copying, self.on_copied = None, None

    def committed(self) -> None:
        if self._delta is not None:
            self._copy.merge(self._delta)
            self._delta = None

    def _held(self, commit: int) -> list[tuple[int, int, np.ndarray, np.ndarray | None]]:
        """The rows this worker can load as of ``commit`` (none if its copy is of another one)."""
        if self._copy is None:
            return []
        if self._copy.commit == commit:
            return self._copy.ranges
        if self._delta is not None and self._delta.commit == commit:
            self.committed()
            return self._copy.ranges
        return []

    def resume(self, commit: int) -> None:
        """After a change (collective, from ``elastic.TorchState.sync``): declare the table again over the
        servers alive, load every row from a rank holding it as of ``commit`` (see _cover), then cut the shards
        anew for the new ``size()``. Does nothing where the job has not changed since the declaration."""
        if not self.elastic:
            return
        eng = ops.engine()
        if self.client.gen == eng.gen:
            if self._copy is not None and self._copy.commit != commit:  # the others took a commit kept on disk
                raise PushPullError(f"sparse table {self.name!r}: the job resumes from commit {commit}, and the "
                                    f"workers' copies of sparse tables are in memory only (this one is of commit "
                                    f"{self._copy.commit}): a sparse table cannot resume after a restart of every "
                                    f"worker")
            return
        from pushpull.torch.gather import allgather_object

        eng.raise_if_changed(f"sparse table {self.name}")  # a change nobody has taken yet: restore again first
        gen = eng.gen  # the generation the plan is agreed in; a later one fails the declaration below
        self._lookups = []  # the interrupted step's lookups: their gradients are not pushed
        held = self._held(commit)
        offers = allgather_object([[lo, hi] for lo, hi, _, _ in held],
                                  name=f"elastic.sparse.{self.name}.held.n{ops.size()}")
        plan = _cover(self.num_embeddings, offers)
        if isinstance(plan, str):
            raise PushPullError(f"sparse table {self.name!r}: no worker holds rows {plan} as of commit {commit} "
                                f"(the workers keeping them were lost at once); the table cannot be restored")
        self.drop_copy()
        self.client.redeclare(gen)
        me = ops.rank()
        for lo, hi, rank in plan:
            if rank != me:
                continue
            for a, b, rows, acc in held:
                x, y = max(lo, a), min(hi, b)
                if x < y:
                    self.client.load(np.arange(x, y, dtype=np.int64), rows[x - a:y - a],
                                     acc[x - a:y - a] if acc is not None else None)
        # every row is loaded before any worker takes its new shards
        ops.push_pull(torch.zeros(1), average=False, name=f"elastic.sparse.{self.name}.loaded")
        self._cut(commit)
        self.resumes += 1

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, name={self.name!r}, "
                f"servers={getattr(self.client, 'servers', 'not declared yet')}")


def _cover(rows: int, offers: list) -> list[tuple[int, int, int]] | str:
    """Who loads what: [(lo, hi, rank)] covering [0, rows) from the ranges each rank offers (the lowest rank
    reaching furthest at each point), or the first range no rank holds, as text."""
    plan, at = [], 0
    while at < rows:
        best = None
        for rank, ranges in enumerate(offers):
            for lo, hi in ranges:
                if lo <= at < hi and (best is None or hi > best[1]):
                    best = (rank, hi)
        if best is None:
            nxt = min([lo for ranges in offers for lo, _ in ranges if lo > at], default=rows)
            return f"[{at}, {nxt})"
        if plan and plan[-1][2] == best[0]:  # the same rank goes on: one range
            plan[-1] = (plan[-1][0], best[1], best[0])
        else:
            plan.append((at, best[1], best[0]))
        at = best[1]
    return plan
