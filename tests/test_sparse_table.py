"""The server's sparse table alone (no processes): its Adagrad matches torch.optim.Adagrad on the dense table."""
from __future__ import annotations

import numpy as np
import torch

from pushpull.server.sparse import SparseTable


def test_adagrad_on_the_touched_rows_matches_torch_adagrad_on_the_dense_table():
    rows, dim, workers, lr = 10, 4, 2, 0.3
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(rows, dim, generator=gen)
    dense = torch.nn.Parameter(start.clone())
    opt = torch.optim.Adagrad([dense], lr=lr, eps=1e-10, initial_accumulator_value=0.1)
    table = SparseTable(1, "t", rows, dim, 0, rows, {"name": "adagrad", "eps": 1e-10,
                                                     "initial_accumulator_value": 0.1}, workers)
    table.set_rows(np.arange(rows), start.numpy())
    for rnd in range(1, 6):
        total = torch.zeros(rows, dim)
        for rank in range(workers):
            ids = torch.unique(torch.randint(0, rows, (4,), generator=gen))
            g = torch.randn(len(ids), dim, generator=gen)
            total.index_add_(0, ids, g)
            done = table.push(rnd, rank, ids.numpy(), g.numpy(), lr)
        assert done == [rnd]
        dense.grad = total / workers
        opt.step()
    np.testing.assert_allclose(table.read(np.arange(rows)), dense.detach().numpy(), rtol=1e-5, atol=1e-6)
