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


def test_a_pull_whose_answer_would_not_fit_in_a_message_is_refused_before_reading_rows():
    from pushpull.config import load_config
    from pushpull.server.sparse import SparseStore
    from pushpull.transport.protocol import Header, Msg, MsgType, encode_json

    cfg = load_config({"PUSHPULL_MAX_MESSAGE_BYTES": str(1 << 20), "BYTEPS_PARTITION_BYTES": "65536"})
    errors, replies = [], []
    store = SparseStore(cfg, lambda ident, h, frames=(): replies.append(h),
                        lambda ident, key, text, req_id=0: errors.append(text), lambda: 0)
    store.num_workers = 1
    decl = {"name": "t", "rows": 100_000, "dim": 64, "lo": 0, "hi": 100_000, "optimizer": {"name": "sgd"}}
    store.handle(b"w0", Msg(Header(MsgType.SPARSE_INIT, sender=0, key=7), [encode_json(decl)]))
    assert not errors and replies[-1].type == MsgType.SPARSE_ACK
    n = 5000  # 5000 x 64 x 4 = 1.28 MB of rows for 40 KB of ids
    store.handle(b"w0", Msg(Header(MsgType.SPARSE_PULL, sender=0, key=7, numel=n),
                            [np.arange(n, dtype=np.int64).tobytes()]))
    assert errors and "asks for 5000 rows, 1280000 bytes, over PUSHPULL_MAX_MESSAGE_BYTES=1048576" in errors[-1]
