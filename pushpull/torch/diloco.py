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

Workers that come and go (elastic training, ``pushpull launch --min-workers M --restart-workers N``): a lost
worker costs its share of the round in progress (the others push that round again in the new job). A worker
that comes into the running job (a replacement) is welcomed at the round where the others notice it: rank 0
sends it where the schedule stands (the inner step, the round ids, the rounds open) and the global
parameters; it takes part in the open rounds *present* but adding nothing (the mean stays the others'), and
pushes its own pseudo-gradients from the next round on. Its inner optimizer starts fresh, as a newcomer's
does in OpenDiLoCo; :attr:`DiLoCo.steps` tells its training loop (and a learning-rate schedule) where the job
is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pushpull import metrics
from pushpull.outer import DEFAULTS, OuterSGD, fragments as _fragments, settings
from pushpull.outer import round_deadline as round_deadline_of
from pushpull.torch import functions, ops
from pushpull.torch.functions import broadcast_parameters
from pushpull.torch.optimizer import reduces_gradients
from pushpull.transport.protocol import OUTER_PRESENT_ONLY
from pushpull.worker.engine import KeySpec
from pushpull.worker.handle import PushPullError, WorkersChanged

MAX_RETRIES = 3  # changes of the workers one outer round goes through before it gives up


@dataclass
class _Round:
    """One outer round: the parameters it carries and where it stands in the schedule (what a newcomer is
    told of the rounds open when it comes in)."""
    rid: int                 # its id: every worker runs the same rounds in the same order
    idx: list                # the parameters' indices
    step: int                # the inner step it was started at
    fragment: int | None     # None: every fragment at once (the start, sync())
    due: int | None = None   # overlap: the step its answer is merged at
    present_only: bool = False  # this worker adds nothing to it (it came into the job in this round)
    tensors: list = field(default_factory=list)
    handles: list = field(default_factory=list)  # engine handles (in a job of one worker, the answers)

    def describe(self) -> dict:
        return {"rid": self.rid, "idx": list(self.idx), "step": self.step, "fragment": self.fragment, "due": self.due}


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
        if reduces_gradients(inner):  # its hooks would reduce every inner step too
            raise ValueError("DiLoCo needs the inner optimizer itself, not a DistributedOptimizer (or "
                             "ScheduledOptimizer) over it: pass the optimizer you wrapped (after the wrapper's "
                             "remove_hooks(), for a synchronous start)")
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
        self.steps = 0       # inner steps taken (by the job: a newcomer starts where the others are)
        self.rounds = 0      # outer rounds completed, of any fragment (the start counts one)
        self._synced = [0] * len(self.fragments)   # the step of each fragment's last round
        self._inflight: dict[int, _Round] = {}     # fragment -> its round whose answer is merged later
        self._local: dict[str, OuterSGD] = {}   # a job of one worker: the outer state is here
        self._global: list[torch.Tensor] = []
        self._ids = 0        # outer rounds started: each round's id (the start is 1)
        self._phase = "start"  # "start", "step" (inside step()), "sync" (inside sync()), "" (between steps)
        self._last_sync = None  # the step of the last sync() (or the start): a second one there is a no-op
        self.changes = 0     # changes of the workers taken during outer rounds (elastic training)
        self.welcomed = 0    # workers this one helped come into the running job
        self.joined_at: int | None = None  # the inner step this worker came into the running job at
        eng = ops.engine()
        # the generation of the last welcome this worker took part in (a newcomer's: the one it came in with);
        # a change that brought someone in later (the engine's arrival_gen) calls for another
        self._welcomed_gen = eng.gen if eng is not None else 0
        self._started_now: tuple[int, set] = (0, set())  # (a step, the fragments whose round it started)
        if eng is not None and eng.joined_late:
            self._come_in()
        else:
            self._start()
        self._phase = ""

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
        self._finish(self._submit(every, None, lambda p, g: p.detach()), mixed=False)
        self._global = [p.detach().clone() for _, p in self.params]
        self._last_sync = 0

    def _submit(self, idx: list[int], fragment: int | None, push, due: int | None = None) -> _Round:
        """The pushes (``push(param, global)``) of parameters ``idx`` in flight at once; returns the round,
        which :meth:`_finish` takes (with the handles, or in a job of one worker the answers themselves)."""
        glob = self._global or [None] * len(self.params)
        self._ids += 1  # every worker runs the same rounds in the same order: the same id for the same round
        rnd = _Round(self._ids, idx, self.steps, fragment, due,
                     present_only=self.joined_at is not None and self.steps <= self.joined_at)
        rnd.tensors = [push(self.params[i][1], glob[i]).detach().contiguous() for i in idx]
        if ops.engine() is None:  # one worker: the same outer steps, here (float64 kept, the rest in float32)
            for i, x in zip(idx, rnd.tensors):
                n, p = self.params[i]
                acc = ops.accumulation_dtype(p.dtype)
                st = self._local.setdefault(n, OuterSGD(**self.outer, dtype=str(acc).replace("torch.", "")))
                rnd.handles.append(torch.from_numpy(st.apply(x.to(device="cpu", dtype=acc).numpy(), 1).copy()))
            return rnd
        self._send(rnd)
        return rnd

    def _send(self, rnd: _Round) -> None:
        rnd.handles = []
        for i, t in zip(rnd.idx, rnd.tensors):
            rnd.handles.append(self._push(i, t, rnd))

    def _push(self, i: int, tensor: torch.Tensor, rnd: _Round) -> int:
        """One parameter's push of outer round ``rnd``: its id rides as the round signature, and the servers
        match an outer round's pushes by it. A change of the workers noticed here (this worker had nothing in
        flight) is taken as it comes: the push goes out in the new job."""
        # a key has one codec: with compression the start's parameters travel compressed too, and every
        # worker takes the servers' answer, so all of them and the servers start from the same values
        name = f"{self.name}.{self.params[i][0]}"
        sig = rnd.rid | (OUTER_PRESENT_ONLY if rnd.present_only else 0)
        try:
            return ops.submit_key(tensor, None, False, name, 0, self.compression, self.spec, sig=sig)
        except WorkersChanged:  # reported once: the second call goes out
            self._changed(rnd)
            return ops.submit_key(tensor, None, False, name, 0, self.compression, self.spec, sig=sig)

    def _finish(self, rnd: _Round, mixed: bool) -> None:
        """The new global parameters arrive: into this worker's copy of them, and into the parameters
        (``mixed`` with them where the exchange overlapped inner steps). Where the workers changed under the
        round (elastic training: a worker was lost, or one came in), the same pushes go again in the new job
        under the same id: the round completes with the workers present, and a key whose step was taken
        before the change answers that step again, so no key is stepped twice and a lost worker costs its
        share of one round."""
        outs: list = [None] * len(rnd.idx)
        for attempt in range(MAX_RETRIES + 1):
            lost, again = None, []
            for j, h in enumerate(rnd.handles):  # every handle is taken, even after a failure, so none is left
                if outs[j] is not None:
                    continue
                try:
                    outs[j] = ops.synchronize(h) if isinstance(h, int) else h
                except WorkersChanged as e:
                    lost = e
                    again.append(j)
            if lost is None:
                break
            if attempt == MAX_RETRIES:
                raise WorkersChanged(f"{self.name}: the workers changed {MAX_RETRIES + 1} times during outer round "
                                     f"{rnd.rid}: {lost}")
            self._changed(rnd)
            # only the pushes that failed go again: one that went out in the new job (the change came while
            # the round was being sent) has its answer, and a second push of it would count twice
            for j in again:
                rnd.handles[j] = self._push(rnd.idx[j], rnd.tensors[j], rnd)
        # a newcomer's round: it had nothing to mix (its parameters were the global ones when it came in)
        mixed = mixed and bool(self.mix) and not rnd.present_only
        with torch.no_grad():
            for i, out in zip(rnd.idx, outs):
                p = self.params[i][1]
                new = out.view_as(p).to(device=p.device, dtype=p.dtype)
                if self._global:
                    self._global[i].copy_(new)
                if mixed:
                    p.mul_(self.mix).add_(new, alpha=1.0 - self.mix)
                else:
                    p.copy_(new)
        self.rounds += 1

    def _round(self, f: int) -> None:
        """Fragment ``f``'s outer round: its pseudo-gradients go out; the answer is taken now, or ``overlap``
        steps later."""
        self._synced[f] = self.steps
        if self._started_now[0] != self.steps:
            self._started_now = (self.steps, set())
        self._started_now[1].add(f)
        rnd = self._submit(self.fragments[f], f, lambda p, g: g - p.detach(),
                           self.steps + self.overlap if self.overlap else None)
        if self.overlap:
            self._inflight[f] = rnd
        else:
            self._finish(rnd, mixed=False)

    def _rounds_due(self, started: set = frozenset()) -> None:
        """The rounds of this step: the answers due merged, then the fragments whose round falls here (but
        those in ``started``) started."""
        for f in [f for f, r in self._inflight.items() if r.due <= self.steps]:
            self._finish(self._inflight.pop(f), mixed=True)
        h, count = self.sync_every, len(self.fragments)
        for f in range(count):
            offset = self.steps - f * h // count
            if offset > 0 and offset % h == 0 and f not in started:
                self._round(f)

    def sync(self) -> None:
        """An outer round of every fragment now, answers taken at once (a collective: every worker calls it at
        the same point), e.g. before evaluating or saving, so that every worker holds the global parameters.
        Where every worker holds them already (a second call at the same step, or every fragment's round fell on
        this step) it does nothing: a round of zero pseudo-gradients would still move them by the momentum."""
        if (self._last_sync == self.steps or self.pending == 0) and not self._inflight:
            return
        self._phase = "sync"
        for f in sorted(self._inflight):
            self._finish(self._inflight.pop(f), mixed=True)
        every = [i for frag in self.fragments for i in frag]
        self._finish(self._submit(every, None, lambda p, g: g - p.detach()), mixed=False)
        self._synced = [self.steps] * len(self.fragments)
        self._last_sync, self._phase = self.steps, ""

    # ------------------------------------------------------------ workers that come and go --
    def _changed(self, rnd: _Round) -> None:
        """The workers changed under round ``rnd`` (noticed on a push or an answer): where someone came in,
        welcome it before the round goes again (the newcomer pushes it too)."""
        self.changes += 1
        self._welcome_newcomers(rnd)

    def _welcome_newcomers(self, rnd: _Round | None) -> None:
        """Where a worker came into the job since the last welcome, welcome it now (every worker does, at a
        step or on the round where it notices: the welcome is a collective, so the first to get there waits
        for the others, and a newcomer waits for a step rather than for the next round)."""
        eng = ops.engine()
        if eng is None or eng.arrival_gen <= self._welcomed_gen:
            return
        open_ = {r.rid: r for r in self._inflight.values()}
        if rnd is not None:
            open_[rnd.rid] = rnd
        started = sorted(self._started_now[1]) if self._started_now[0] == self.steps else []
        state = {"steps": self.steps, "ids": self._ids, "rounds": self.rounds, "synced": list(self._synced),
                 "phase": self._phase, "open": [open_[k].describe() for k in sorted(open_)], "started": started,
                 "last_sync": self._last_sync, "schedule": self._schedule(),
                 "seeds": [None if sd is None else [sd[0], sd[2] is not None] for sd in map(ops.get_seed, self._keys())]}
        _, self._welcomed_gen = self._welcome(state)
        self.welcomed += 1

    def _keys(self) -> list[str]:
        """The servers' name of each parameter's outer key."""
        return [f"{self.name}.{n}" for n, _ in self.params]

    def _schedule(self) -> dict:
        return {"sync_every": self.sync_every, "fragments": [list(f) for f in self.fragments],
                "overlap": self.overlap, "names": [n for n, _ in self.params]}

    def _welcome(self, state: dict | None) -> tuple[dict, int]:
        """Rank 0's schedule and global parameters to every worker (a collective of the new job: the
        others' copies are thrown away; only the newcomer takes them). Returns them and the generation the
        welcome completed in (its names carry it, so workers of different generations never meet in one)."""
        for attempt in range(MAX_RETRIES + 1):
            gen = ops.engine().gen
            try:
                got = functions.broadcast_object(state, root_rank=0, name=f"{self.name}.welcome.{gen}.state")
                glob = [(n, (self._global[i] if self._global else p.detach()).clone())
                        for i, (n, p) in enumerate(self.params)]
                broadcast_parameters(glob, root_rank=0, prefix=f"{self.name}.welcome.{gen}.")
                # rank 0's seeds (elastic jobs keep them: TensorTable.seeds), parameters and momentum as its I/O
                # thread holds them (an answer may be ahead of the global parameters above, in an overlap
                # window), so that the newcomer's seeds are as good as the others' should a server be lost
                seeds = got.get("seeds", []) if isinstance(got, dict) else []
                sent = []
                for i, ((n, p), key) in enumerate(zip(self.params, self._keys())):
                    if i < len(seeds) and seeds[i] is not None:
                        mine = ops.get_seed(key) if ops.rank() == 0 else None
                        for part, wanted in ((1, True), (2, bool(seeds[i][1]))):
                            if wanted:
                                sent.append((f"{part}.{n}", torch.from_numpy(mine[part].copy()) if mine is not None
                                             else torch.zeros(p.numel(), dtype=ops.accumulation_dtype(p.dtype))))
                if sent:
                    broadcast_parameters(sent, root_rank=0, prefix=f"{self.name}.welcome.{gen}.seed.")
                return {"state": got, "global": [t for _, t in glob], "seeds": dict(sent)}, gen
            except WorkersChanged as e:
                if attempt == MAX_RETRIES:
                    raise WorkersChanged(f"{self.name}: the workers changed {MAX_RETRIES + 1} times while a "
                                         f"newcomer was welcomed: {e}") from e
        raise AssertionError("unreachable")

    def _come_in(self) -> None:
        """This worker came into the running job: take rank 0's schedule and global parameters, push the
        rounds open there (present, adding nothing), and go on from the others' step."""
        got, self._welcomed_gen = self._welcome(None)
        st = got["state"]
        if st is None or not isinstance(st, dict):
            raise PushPullError(f"{self.name}: rank 0 sent no schedule to this newcomer (rank {ops.rank()})")
        mine = self._schedule()
        for k in mine:
            if st["schedule"].get(k) != mine[k]:
                raise PushPullError(f"{self.name}: this newcomer's {k} ({mine[k]!r}) differs from the running "
                                    f"job's ({st['schedule'].get(k)!r}); start it with the same DiLoCo settings")
        with torch.no_grad():
            for (_, p), g in zip(self.params, got["global"]):
                p.copy_(g.view_as(p).to(device=p.device, dtype=p.dtype))
        self._global = [p.detach().clone() for _, p in self.params]
        for (n, p), key, seed in zip(self.params, self._keys(), st.get("seeds", [])):
            if seed is not None:  # rank 0's seeds: this worker's answers advance them from here on
                mom = got["seeds"].get(f"2.{n}")
                ops.set_seed(key, int(seed[0]), got["seeds"][f"1.{n}"].numpy(), None if mom is None else mom.numpy())
        self.steps, self._ids, self.rounds = int(st["steps"]), int(st["ids"]), int(st["rounds"])
        self._synced = [int(s) for s in st["synced"]]
        self._last_sync = st["last_sync"]
        self.joined_at = self.steps
        started = {int(f) for f in st.get("started", ())}  # rank 0 started these fragments' rounds at this step
        for d in st["open"]:  # oldest first, as the others pushed them
            rnd = _Round(int(d["rid"]), [int(i) for i in d["idx"]], int(d["step"]), d["fragment"], d["due"],
                         present_only=True)
            rnd.tensors = [torch.zeros_like(self.params[i][1]).detach().contiguous() for i in rnd.idx]
            self._send(rnd)
            if rnd.fragment is not None and rnd.due is not None:
                self._inflight[int(rnd.fragment)] = rnd
            else:
                self._finish(rnd, mixed=False)
            if rnd.fragment is not None and rnd.step == self.steps:
                started.add(int(rnd.fragment))
        if st["phase"] == "step":  # rank 0 was in the middle of a step: its remaining rounds
            self._rounds_due(started)
        elif st["phase"] == "sync" and not any(d["fragment"] is None and d["step"] == self.steps for d in st["open"]):
            self.sync()  # rank 0 was finishing answers before its sync round: the sync round follows
        elif st["phase"] == "sync":
            self._last_sync = self.steps
        elif st["phase"] == "start":
            self._last_sync = 0

    # ------------------------------------------------------------ optimizer --
    def step(self, closure=None):
        # a newcomer waits in its welcome until the others get here (a step, not the next round); here, between
        # steps, so that a sync() the others run after a step is one the newcomer runs too
        self._welcome_newcomers(None)
        loss = self.inner.step(closure)
        self.steps += 1
        metrics.step_done()
        self._phase = "step"
        self._rounds_due()
        self._phase = ""
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
