"""Asynchronous training (BytePS's ``enable_async``) from PyTorch.

Why: with synchronous rounds one slow worker sets everyone's pace. Here no worker waits for another:
each runs its own optimizer step on its own gradients, pushes the change it made to the parameters
(a delta), and pulls the servers' parameters, which every worker's deltas have moved, at once.

How: each parameter is a *store* key on the servers (declared ``op="store"``; only keys declared so
are stores, so metric reductions and broadcasts in the same job keep their meaning). The servers'
copy starts as rank 0's parameters: rank 0 adds them to the empty store, every worker waits at a
barrier, all pull, and wait at a second one (a fast worker's first delta must not reach the servers
before a slow one has pulled the start). After that a step is: local step -> push delta -> pull parameters. Only job
members can push (authenticated connections, the sender checked against its connection). The
learning rate is a single worker's: every delta lands, so n workers take n steps of it per round.

A lost server (elastic training, ``--min-workers``): each pull is also kept as the key's *seed*, and the
server a key moves to starts from the seed of the worker that has taken the most steps, not from zeros. A
change costs at most the deltas in flight when it came (their answers fail; they are not sent again, so none
lands twice) and those the lost server took after that worker's last pull.
"""
from __future__ import annotations

import torch

from pushpull.torch import ops
from pushpull.torch.hooks import register_step_callback, step_done
from pushpull.worker.engine import KeySpec
from pushpull.worker.handle import WorkersChanged

STORE = KeySpec(kind="async", op="store")


class _AsyncOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters):
        super(self.__class__, self).__init__(params)  # type: ignore[misc]
        mine = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            self._keys = {p: f"async.noname.{i}" for i, p in enumerate(mine)}
        else:
            by_id = {id(p): n for n, p in named_parameters}
            self._keys = {p: f"async.{by_id[id(p)]}" for p in mine if id(p) in by_id}
            missing = [i for i, p in enumerate(mine) if id(p) not in by_id]
            if missing:
                raise ValueError(f"{len(missing)} parameter(s) of the optimizer are not in named_parameters")
        self.pushes = 0
        self.changes = 0  # changes of the job (elastic training) taken inside step()
        self._start()

    def _start(self) -> None:
        """The servers' parameters start as rank 0's, and every worker starts from them."""
        if ops.engine() is None:
            return
        for p, key in self._keys.items():
            mine = p.detach().clone() if ops.rank() == 0 else torch.zeros_like(p.detach())
            ops.reduce_now(mine, None, False, key, spec=STORE)
        ops.barrier()
        self._pull_all()
        ops.barrier()  # nobody's first delta may reach the servers before everyone has pulled the start

    def _pull_all(self) -> None:
        for p, key in self._keys.items():
            self._take(p, key, ops.reduce_now(torch.zeros_like(p.detach()), None, False, key, spec=STORE))

    def _take(self, p: torch.Tensor, key: str, pulled: torch.Tensor) -> None:
        """The servers' parameters into ``p``, and, in an elastic job, kept as the key's seed: if its server is
        lost, the server it moves to starts from the copy of the worker that has taken the most steps (the
        pulled tensor is this call's own and is not written again, so on the CPU the seed is a view of it)."""
        with torch.no_grad():
            p.copy_(pulled)
        eng = ops.engine()
        if eng is not None and eng.table.keep_seeds:  # an elastic job, where a server can be lost
            acc = ops.accumulation_dtype(pulled.dtype)
            ops.set_seed(key, self.pushes + 1, pulled.detach().to(device="cpu", dtype=acc).reshape(-1).numpy())

    def step(self, closure=None):
        if ops.engine() is None:
            result = super(self.__class__, self).step(closure)  # type: ignore[misc]
            step_done(self)
            return result
        before = {p: p.detach().clone() for p in self._keys}
        result = super(self.__class__, self).step(closure)  # type: ignore[misc]
        handles = []
        for p, key in self._keys.items():
            delta = p.detach() - before[p]
            try:
                handles.append((p, key, ops.submit_key(delta, None, False, key, 0, None, STORE)))
            except WorkersChanged:  # noticed as it was submitted, nothing went out: it goes in the new job
                handles.append((p, key, ops.submit_key(delta, None, False, key, 0, None, STORE)))
        changed = None
        for p, key, h in handles:  # the servers' parameters, with every worker's deltas so far
            try:
                self._take(p, key, ops.synchronize(h))
            except WorkersChanged as e:  # a server or a worker was lost (elastic training): see _changed
                changed = e
        if changed is not None:
            self._changed(changed)
        self.pushes += 1
        step_done(self)
        return result

    def _changed(self, why: WorkersChanged) -> None:
        """The job changed under this step's pushes. A delta whose answer did not come may or may not have
        landed (on a surviving server before the change; on the lost one, and lost with it): it is not sent
        again, so none lands twice, and every parameter is pulled again from the servers of the new job (a
        moved key starts from its seed). The cost: at most this step's delta of this worker, and the deltas
        the lost server took after the pull of the seed the new server starts from."""
        self.changes += 1
        for attempt in range(3):
            try:
                self._pull_all()
                return
            except WorkersChanged as e:
                why = e
        raise WorkersChanged(f"asynchronous training: the workers changed 3 times in a row: {why}")

    register_step_callback = register_step_callback


def AsyncOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for asynchronous training (module docstring). Call it on every worker at the
    same point (its start is a collective: the servers take rank 0's parameters)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"AsyncOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_AsyncOptimizer.__dict__))
    return cls(optimizer.param_groups, list(named_parameters) if named_parameters is not None else None)
