"""Local SGD and DiLoCo (Douillard et al., arXiv 2311.08105): communicate every H steps, not every step.

Why: a synchronous step cannot beat c + M/B, and on slow or far links M/B is most of the step. Here each
worker takes ``sync_every`` (H) steps of its own optimizer (the *inner* one, AdamW in DiLoCo) alone; then
every worker pushes its *pseudo-gradient*, the global parameters minus its local ones, and the servers,
which hold the global parameters and the *outer* optimizer's momentum (one per key, partitioned like every
key; :mod:`pushpull.outer`), average the pushes of the workers present, take one outer step (SGD with
Nesterov momentum 0.9, lr 0.7: DiLoCo's settings) and answer every worker with the new global parameters.
Plain local SGD is ``outer_lr=1, outer_momentum=0, nesterov=False``: the mean of the local parameters.

    inner = torch.optim.AdamW(model.parameters(), lr=4e-4)
    opt = pushpull.torch.DiLoCo(inner, model.named_parameters(), sync_every=100)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()   # every 100th step also syncs

Start: rank 0's parameters go to every worker (a broadcast) and become the servers' global parameters
(the first round, whose pushes are the parameters themselves). The inner optimizer's state stays local,
as in DiLoCo. A job of one worker applies the same outer steps itself.
"""
from __future__ import annotations

import torch

from pushpull.outer import DEFAULTS, OuterSGD, settings
from pushpull.torch import ops
from pushpull.torch.functions import broadcast_parameters
from pushpull.worker.engine import KeySpec


class DiLoCo:
    """Wraps an inner optimizer: :meth:`step` is its step, and every ``sync_every``-th one is followed by an
    outer round (:meth:`sync`). ``named_parameters``: the model's (names make the servers' keys)."""

    def __init__(self, inner: torch.optim.Optimizer, named_parameters, sync_every: int = 100,
                 outer_lr: float = DEFAULTS["outer_lr"], outer_momentum: float = DEFAULTS["outer_momentum"],
                 nesterov: bool = DEFAULTS["nesterov"], name: str = "diloco"):
        if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
            raise ValueError(f"sync_every must be an integer >= 1, got {sync_every!r}")
        self.outer = settings({"outer_lr": outer_lr, "outer_momentum": outer_momentum, "nesterov": nesterov})
        self.inner, self.sync_every, self.name = inner, sync_every, name
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        mine = {id(p) for g in inner.param_groups for p in g["params"]}
        self.params = [(n, p) for n, p in named if id(p) in mine]
        missing = len(mine) - len(self.params)
        if missing:
            raise ValueError(f"{missing} parameter(s) of the inner optimizer are not in named_parameters")
        if len({n for n, _ in self.params}) != len(self.params):
            raise ValueError("named_parameters has a name twice: the servers' keys would collide")
        self.spec = KeySpec(kind="diloco", op="outer", meta=tuple(sorted(self.outer.items())))
        self.steps = 0       # inner steps taken
        self.pending = 0     # inner steps since the last outer round
        self.rounds = 0      # outer rounds completed (the start included)
        self._local: dict[str, OuterSGD] = {}   # a job of one worker: the outer state is here
        self._global: list[torch.Tensor] = []
        self._start()

    # ------------------------------------------------------------ the rounds --
    def _start(self) -> None:
        """Every worker starts from rank 0's parameters, and so do the servers' global parameters."""
        if ops.engine() is not None:
            broadcast_parameters(self.params, root_rank=0, prefix=f"{self.name}.start.")
        self._exchange(lambda p, g: p.detach())

    def _exchange(self, push) -> None:
        """One outer round: every parameter's push (``push(param, global)``) in flight at once; the answer,
        the new global parameters, goes into the parameter and into this worker's copy of them."""
        first = not self._global
        globals_ = self._global or [None] * len(self.params)
        if ops.engine() is None:  # one worker: the same outer steps, here (float64 kept, the rest in float32)
            outs = []
            for (n, p), g in zip(self.params, globals_):
                acc = torch.float64 if p.dtype == torch.float64 else torch.float32
                st = self._local.setdefault(n, OuterSGD(**self.outer, dtype=str(acc).replace("torch.", "")))
                x = push(p, g).detach().to(device="cpu", dtype=acc).numpy()
                outs.append(torch.from_numpy(st.apply(x, 1).copy()))
        else:
            handles = [ops.submit_key(push(p, g).detach().contiguous(), None, False, f"{self.name}.{n}", 0, None,
                                      self.spec)
                       for (n, p), g in zip(self.params, globals_)]
            outs = [ops.synchronize(h) for h in handles]
        with torch.no_grad():
            for (_, p), out in zip(self.params, outs):
                p.copy_(out.view_as(p))
        if first:
            self._global = [p.detach().clone() for _, p in self.params]
        else:
            for g, (_, p) in zip(self._global, self.params):
                g.copy_(p.detach())
        self.rounds += 1

    def sync(self) -> None:
        """An outer round now (a collective: every worker calls it at the same point; ``step`` does every
        ``sync_every`` steps): push the pseudo-gradients, take the servers' new global parameters. Also
        before evaluating or saving the model, so that it holds the global parameters."""
        self._exchange(lambda p, g: g - p.detach())
        self.pending = 0

    # ------------------------------------------------------------ optimizer --
    def step(self, closure=None):
        loss = self.inner.step(closure)
        self.steps += 1
        self.pending += 1
        if self.pending >= self.sync_every:
            self.sync()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.inner.param_groups

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "steps": self.steps, "rounds": self.rounds,
                "pending": self.pending}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.steps, self.rounds, self.pending = int(state["steps"]), int(state["rounds"]), int(state["pending"])
