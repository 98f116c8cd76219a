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
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pushpull.torch import ops
from pushpull.worker.sparse import SparseClient


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
        self.client = SparseClient(eng, self.name, self.num_embeddings, self.embedding_dim, spec)
        self._lookups: list[tuple[torch.Tensor, torch.Tensor]] = []
        if weight is not None:
            if tuple(weight.shape) != (self.num_embeddings, self.embedding_dim):
                raise ValueError(f"SparseEmbedding {self.name!r}: weight is {list(weight.shape)}, expected "
                                 f"[{self.num_embeddings}, {self.embedding_dim}]")
            if ops.rank() == 0:
                w = weight.detach().to("cpu", torch.float32).contiguous().numpy()
                self.client.load(np.arange(self.num_embeddings, dtype=np.int64), w)
        ops.barrier()  # every worker's first lookup reads the loaded table

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        if indices.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"SparseEmbedding {self.name!r}: indices must be int64 or int32, got {indices.dtype}")
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
        ids, grads = [], []
        for uniq, rows in self._lookups:
            if rows.grad is not None:
                ids.append(uniq)
                grads.append(rows.grad.to("cpu", torch.float32))
        self._lookups = []
        if len(ids) > 1:  # several lookups: one gradient per row, summed as a dense embedding's would be
            all_ids = torch.cat(ids)
            uniq, inverse = torch.unique(all_ids, return_inverse=True)
            g = torch.zeros(len(uniq), self.embedding_dim).index_add_(0, inverse, torch.cat(grads))
            ids, grads = [uniq], [g]
        if ids:
            self.client.push(ids[0].numpy(), grads[0].contiguous().numpy(), self.lr)
        else:
            self.client.push(np.empty(0, np.int64), np.empty((0, self.embedding_dim), np.float32), self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the lookups since the last step (their gradients are not pushed)."""
        self._lookups = []

    @torch.no_grad()
    def table(self) -> torch.Tensor:
        """The whole table as the servers hold it after this worker's last step (checkpoints, tests)."""
        self.client.flush()  # a refused push is raised here, not hidden behind the read
        return torch.from_numpy(self.client.pull(np.arange(self.num_embeddings, dtype=np.int64)))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, name={self.name!r}, servers={self.client.servers}"
