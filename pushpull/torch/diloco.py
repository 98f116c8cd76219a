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

Streaming (Streaming DiLoCo, arXiv 2501.18512): with ``fragments`` F > 1 the parameters are cut into F
contiguous groups of about equal size, and fragment f has its outer round at the steps where
``(step - f * H // F) % H == 0``, so the link carries 1/F of the model at a time instead of all of it at once.
With ``overlap`` τ > 0 a fragment's exchange runs while the next τ inner steps go on, and its answer is merged
when it is due: ``local = mix * local + (1 - mix) * global`` (the local fragment moved on meanwhile).
"""
from __future__ import annotations

import torch

from pushpull import metrics
from pushpull.outer import DEFAULTS, OuterSGD, fragments as _fragments, settings
from pushpull.outer import round_deadline as round_deadline_of
from pushpull.torch import ops
from pushpull.torch.functions import broadcast_parameters
from pushpull.worker.engine import KeySpec
from pushpull.worker.handle import PushPullError, WorkersChanged

MAX_RETRIES = 3  # changes of the workers one outer round goes through before it gives up


class DiLoCo:
    """Wraps an inner optimizer: :meth:`step` is its step, followed by the outer rounds that fall on it
    (every ``sync_every`` steps per fragment). ``named_parameters``: the model's (names make the servers'
    keys)."""

    def __init__(self, inner: torch.optim.Optimizer, named_parameters, sync_every: int = 100,
                 outer_lr: float = DEFAULTS["outer_lr"], outer_momentum: float = DEFAULTS["outer_momentum"],
                 nesterov: bool = DEFAULTS["nesterov"], fragments: int = 1, overlap: int = 0, mix: float = 0.5,
                 compression=None, name: str = "diloco", round_deadline=None):
        for what, v, low in (("sync_every", sync_every, 1), ("fragments", fragments, 1), ("overlap", overlap, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{what} must be an integer >= {low}, got {v!r}")
        if overlap >= sync_every:
            raise ValueError(f"overlap ({overlap} steps) must be shorter than sync_every ({sync_every}): a "
                             f"fragment's answer must arrive before its next round")
        if not isinstance(mix, (int, float)) or isinstance(mix, bool) or not 0 <= mix <= 1:
            raise ValueError(f"mix must be a number in [0, 1], got {mix!r}")
        self.outer = settings({"outer_lr": outer_lr, "outer_momentum": outer_momentum, "nesterov": nesterov})
        # None: a round waits for every worker; "auto" or seconds: past it the servers complete the round
        # with the workers that pushed (a straggler's late push gets the result and does not count)
        self.round_deadline = round_deadline_of({"round_deadline": round_deadline})
        self.inner, self.sync_every, self.name = inner, sync_every, name
        self.overlap, self.mix = overlap, float(mix)
        # the pseudo-gradients' codec on the way to the servers (e.g. Compression.build("int8", block=256));
        # the answer, the global parameters, comes back whole
        self.compression = compression
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        mine = {id(p) for g in inner.param_groups for p in g["params"]}
        self.params = [(n, p) for n, p in named if id(p) in mine]
        missing = len(mine) - len(self.params)
        if missing:
            raise ValueError(f"{missing} parameter(s) of the inner optimizer are not in named_parameters")
        if len({n for n, _ in self.params}) != len(self.params):
            raise ValueError("named_parameters has a name twice: the servers' keys would collide")
        if fragments > len(self.params):
            raise ValueError(f"fragments ({fragments}) must not exceed the parameters ({len(self.params)})")
        self.fragments = _fragments([p.numel() for _, p in self.params], fragments)
        meta = dict(self.outer, **({"round_deadline": self.round_deadline} if self.round_deadline is not None else {}))
        self.spec = KeySpec(kind="diloco", op="outer", meta=tuple(sorted(meta.items())))
        self.steps = 0       # inner steps taken
        self.rounds = 0      # outer rounds completed, of any fragment (the start counts one)
        self._synced = [0] * len(self.fragments)   # the step of each fragment's last round
        self._inflight: dict[int, tuple[int, tuple]] = {}   # fragment -> (the step it is due, its exchange)
        self._local: dict[str, OuterSGD] = {}   # a job of one worker: the outer state is here
        self._global: list[torch.Tensor] = []
        self._ids = 0        # outer rounds started: each round's id (the start is 1)
        self.changes = 0     # changes of the workers taken during outer rounds (elastic training)
        eng = ops.engine()
        if eng is not None and eng.joined_late:
            raise PushPullError(f"{name}: this worker came into a running job (rank {ops.rank()} of {ops.size()}); "
                                f"DiLoCo takes workers that leave, not ones that join a running job yet "
                                f"(docs/diloco.md)")
        self._size = ops.size()
        self._start()

    @property
    def pending(self) -> int:
        """Inner steps since the stalest fragment's last outer round (0: every worker holds the global
        parameters)."""
        return self.steps - min(self._synced) if not self._inflight else self.steps

    # ------------------------------------------------------------ the rounds --
    def _start(self) -> None:
        """Every worker starts from rank 0's parameters, and so do the servers' global parameters."""
        if ops.engine() is not None:
            broadcast_parameters(self.params, root_rank=0, prefix=f"{self.name}.start.")
        every = list(range(len(self.params)))
        self._finish(self._submit(every, lambda p, g: p.detach()), mixed=False)
        self._global = [p.detach().clone() for _, p in self.params]

    def _submit(self, idx: list[int], push) -> tuple:
        """The pushes (``push(param, global)``) of parameters ``idx`` in flight at once; returns what
        :meth:`_finish` takes: the parameters, the tensors pushed, the round's id, and the handles (in a job
        of one worker, the answers themselves)."""
        glob = self._global or [None] * len(self.params)
        self._ids += 1  # every worker runs the same rounds in the same order: the same id for the same round
        tensors = [push(self.params[i][1], glob[i]).detach().contiguous() for i in idx]
        if ops.engine() is None:  # one worker: the same outer steps, here (float64 kept, the rest in float32)
            outs = []
            for i, x in zip(idx, tensors):
                n, p = self.params[i]
                acc = torch.float64 if p.dtype == torch.float64 else torch.float32
                st = self._local.setdefault(n, OuterSGD(**self.outer, dtype=str(acc).replace("torch.", "")))
                outs.append(torch.from_numpy(st.apply(x.to(device="cpu", dtype=acc).numpy(), 1).copy()))
            return idx, tensors, self._ids, outs
        return idx, tensors, self._ids, [self._push(i, t, self._ids) for i, t in zip(idx, tensors)]

    def _push(self, i: int, tensor: torch.Tensor, rid: int) -> int:
        """One parameter's push of outer round ``rid``: the id rides as the round signature, and the servers
        match an outer round's pushes by it. A change of the workers noticed here (this worker had nothing in
        flight) is taken as it comes: the push goes out in the new job."""
        # a key has one codec: with compression the start's parameters travel compressed too, and every
        # worker takes the servers' answer, so all of them and the servers start from the same values
        name = f"{self.name}.{self.params[i][0]}"
        try:
            return ops.submit_key(tensor, None, False, name, 0, self.compression, self.spec, sig=rid)
        except WorkersChanged:  # reported once: the second call goes out
            self.changes += 1
            self._no_newcomer()
            return ops.submit_key(tensor, None, False, name, 0, self.compression, self.spec, sig=rid)

    def _no_newcomer(self) -> None:
        """A worker that came into the running job (elastic training with a replacement) would be expected in
        every round from now on but cannot know where the others are in their schedule: fail at once, naming
        it, rather than wait out the round's deadline. Leaving workers are taken (docs/diloco.md)."""
        eng = ops.engine()
        size = eng.size if eng is not None else 1  # the engine's: updated before any operation fails
        if size > self._size:
            raise PushPullError(f"{self.name}: a worker came into the running job ({self._size} -> {size} "
                                f"workers); DiLoCo takes workers that leave, not ones that join a running job "
                                f"yet: run it without --restart-workers (docs/diloco.md)")
        self._size = size

    def _finish(self, started: tuple, mixed: bool) -> None:
        """The new global parameters arrive: into this worker's copy of them, and into the parameters
        (``mixed`` with them where the exchange overlapped inner steps). Where the workers changed under the
        round (elastic training: a worker was lost), the same pushes go again in the new job under the same
        id: the round completes with the workers present, and a key whose step was taken before the change
        answers that step again, so no key is stepped twice and a lost worker costs its share of one round."""
        idx, tensors, rid, handles = started
        for attempt in range(MAX_RETRIES + 1):
            outs, lost = [], None
            for h in handles:  # every handle is taken, even after a failure, so none is left behind
                try:
                    outs.append(ops.synchronize(h) if isinstance(h, int) else h)
                except WorkersChanged as e:
                    lost = e
                    outs.append(None)
            if lost is None:
                break
            if attempt == MAX_RETRIES:
                raise WorkersChanged(f"{self.name}: the workers changed {MAX_RETRIES + 1} times during outer round "
                                     f"{rid}: {lost}")
            self.changes += 1
            self._no_newcomer()
            handles = [self._push(i, t, rid) for i, t in zip(idx, tensors)]
        with torch.no_grad():
            for i, out in zip(idx, outs):
                p = self.params[i][1]
                new = out.view_as(p).to(device=p.device, dtype=p.dtype)
                if self._global:
                    self._global[i].copy_(new)
                if mixed and self.mix:
                    p.mul_(self.mix).add_(new, alpha=1.0 - self.mix)
                else:
                    p.copy_(new)
        self.rounds += 1

    def _round(self, f: int) -> None:
        """Fragment ``f``'s outer round: its pseudo-gradients go out; the answer is taken now, or ``overlap``
        steps later."""
        idx = self.fragments[f]
        started = self._submit(idx, lambda p, g: g - p.detach())
        self._synced[f] = self.steps
        if self.overlap:
            self._inflight[f] = (self.steps + self.overlap, started)
        else:
            self._finish(started, mixed=False)

    def sync(self) -> None:
        """An outer round of every fragment now, answers taken at once (a collective: every worker calls it at
        the same point), e.g. before evaluating or saving, so that every worker holds the global parameters."""
        for f in sorted(self._inflight):
            self._finish(self._inflight.pop(f)[1], mixed=True)
        every = [i for frag in self.fragments for i in frag]
        self._finish(self._submit(every, lambda p, g: g - p.detach()), mixed=False)
        self._synced = [self.steps] * len(self.fragments)

    # ------------------------------------------------------------ optimizer --
    def step(self, closure=None):
        loss = self.inner.step(closure)
        self.steps += 1
        metrics.step_done()
        for f in [f for f, (due, _) in self._inflight.items() if due <= self.steps]:
            self._finish(self._inflight.pop(f)[1], mixed=True)
        h, count = self.sync_every, len(self.fragments)
        for f in range(count):
            offset = self.steps - f * h // count
            if offset > 0 and offset % h == 0:
                self._round(f)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.inner.param_groups

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "steps": self.steps, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.steps, self.rounds = int(state["steps"]), int(state["rounds"])
