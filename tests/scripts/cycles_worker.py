"""One worker: a few training steps of each kind, then the same steps again with Python's cyclic garbage collector
off and every object it would have freed kept (gc.DEBUG_SAVEALL). A step that leaves reference cycles keeps its
buffers (gradients, outputs) alive until the collector runs: on a large model, gigabytes. Prints ``CYCLES <mode>
<objects> <types>`` per mode (rank 0)."""
from __future__ import annotations

import collections
import gc
import os

import torch

import pushpull.torch as bps


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def named(m: torch.nn.Module, mode: str) -> list:
    """Parameters under names of this mode's own (each optimizer's keys on the servers apart)."""
    return [(f"{mode}.{n}", p) for n, p in m.named_parameters()]


def optimizers():
    if os.environ.get("PUSHPULL_BACKEND") == "allreduce":
        yield "allreduce", model(), lambda m, o, mode: bps.DistributedOptimizer(o, named_parameters=named(m, mode))
        return
    yield "push_pull", model(), lambda m, o, mode: bps.DistributedOptimizer(o, named_parameters=named(m, mode))
    yield "fp16", model(), lambda m, o, mode: bps.DistributedOptimizer(o, named_parameters=named(m, mode),
                                                                compression=bps.Compression.fp16)
    yield "diloco", model(), lambda m, o, mode: bps.DiLoCo(o, named(m, mode), sync_every=2)
    yield "streaming-int8", model(), lambda m, o, mode: bps.DiLoCo(o, named(m, mode), sync_every=4, fragments=2,
                                                              overlap=1, compression=bps.Compression.build("int8"))


def main() -> None:
    bps.init()
    for mode, m, wrap in optimizers():
        opt = wrap(m, torch.optim.AdamW(m.parameters(), lr=1e-3), mode)

        def step():
            x = torch.randn(16, 32)
            loss = m(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            t = torch.ones(100)
            bps.allreduce(t, name=f"{mode}.sum")
            bps.allgather(t, name=f"{mode}.gather")

        for _ in range(4):
            step()
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        for _ in range(8):
            step()
        gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        if bps.rank() == 0:
            print(f"CYCLES {mode} {len(gc.garbage)} {dict(kinds.most_common(5))}", flush=True)
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        if isinstance(opt, bps.DiLoCo):
            opt.sync()
        else:
            opt.remove_hooks() if hasattr(opt, "remove_hooks") else None
    bps.shutdown()


if __name__ == "__main__":
    main()
