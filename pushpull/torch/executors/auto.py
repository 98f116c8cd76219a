"""``auto``: measure, ask the simulator, pick the backend and strategy, confirm.

Why online: ``pushpull plan`` needs a profile and a cluster description the
user may not have; the job itself can measure both in a few steps.

1. **Measure** (``warmup_steps`` + 1 steps, running ``wfbp`` over the configured
   backend): each gradient's ready time and size, the forward gap (from the
   previous backward's end to the first gradient, minus time blocked on
   reductions), whether updates are layer-wise, and the step time. At the end
   of the last of these steps every rank times the same probes on each
   backend: one reduction of min(model, ``probe_bytes``), one of a single
   element, a stream of 16 small ones (:meth:`Auto.probe`).
2. **Decide** (rank 0): a Profile and one ClusterConfig per backend fitted to
   the probes (:mod:`.auto_plan`), the planner over strategies, partitions and
   credits, the fastest candidate and the runner-up (best of the other backend, or of
   another strategy). The choice goes to every rank as numbers (a broadcast, as the
   planned strategies agree on their plans), so every rank switches at the same
   step to the same thing; fusion and MG-WFBP get rank 0's measured ready times
   instead of measuring again, MG-WFBP the simulator's alpha and beta.
3. **Confirm** (``confirm_steps`` steps, the first dropped: new keys): where the
   runner-up is on the other backend, run it as long and keep the faster of the
   two measured (the model ranks strategies over one backend well, two backends
   less so); else keep the choice if its median step is within ``tolerance`` of
   the prediction or faster than the warm-up's, or run the runner-up and keep
   the faster.

Switches happen only between steps (after ``wait_all``, or with layer-wise
updates when the next step's first gradient arrives, the previous step's
reductions all waited for). Cost: ``warmup_steps`` + 1 + ``confirm_steps``
steps (+ ``confirm_steps`` on a fallback) and the probes. With compression only
the parameter servers are considered; ``candidates`` (``["ps:*", "fusion"]``)
restricts the choice. ``decision`` (a dict) says what was chosen and why.
"""
from __future__ import annotations

import logging
import socket
import statistics
import time

import torch

from pushpull.config import data_lane_on
from pushpull.policy import register_executor
from pushpull.torch import ops
from pushpull.torch.executors import auto_plan
from pushpull.torch.executors.base import Strategy
from pushpull.torch.executors.comm import Comm, make_comm

log = logging.getLogger("pushpull.auto")

PLANNED = ("fusion", "mgwfbp")



def _engine_partition_bytes() -> int:
    """The key size the PS engine partitions with (an optimizer may have fitted it to the model)."""
    eng = ops.engine()
    return int(eng.cfg.partition_bytes if eng is not None else ops.config().partition_bytes)

class _Renamed(Comm):
    """Another comm's reductions under suffixed names: a PS key keeps the partitioning of its first use,
    so a delegate with its own partition size needs its own keys (as the auto-tuner's ``@p`` suffix)."""

    def __init__(self, inner: Comm, suffix: str):
        self.inner, self.suffix, self.backend = inner, suffix, inner.backend

    def submit(self, tensor, name, priority, average=True):
        return self.inner.submit(tensor, name + self.suffix, priority, average)

    def wait(self, token) -> None:
        self.inner.wait(token)

    def poll(self, token) -> bool:
        return self.inner.poll(token)

    def set_scheduling(self, partition_bytes: int, credit_bytes: int) -> None:
        self.inner.set_scheduling(partition_bytes, credit_bytes)

    def default_scheduling(self) -> tuple[int, int]:
        return self.inner.default_scheduling()

    def scope(self):
        return self.inner.scope()


def _colocated() -> bool:
    """Is a server on this worker's host? (The address this host uses to reach it is the server's own.)"""
    eng = ops.engine()
    book = getattr(getattr(eng, "member", None), "book", None) or {}
    for s in book.get("servers", []):
        try:
            addr = socket.gethostbyname(str(s["host"]))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.connect((addr, 9))
                if u.getsockname()[0] == addr:
                    return True
        except OSError:
            continue
    return False


def _median_time(fn, reps: int) -> float:
    fn()  # first use sets up keys: not timed
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


@register_executor("auto", "runtime")
class Auto(Strategy):
    """Runs one delegate strategy at a time and chooses it (module docstring); ``decision`` says why."""

    name = "auto"

    def __init__(self, compression=None, backend: str | None = None, comm: Comm | None = None,
                 warmup_steps: int | None = None, confirm_steps: int = 3, tolerance: float = 0.1,
                 candidates=None, probe_bytes: int = 4_000_000, comms: dict | None = None, **options):
        cfg = ops.config()
        start = backend or (comm.backend if comm is not None else cfg.backend)
        if compression and start != "ps":
            raise ValueError("auto: compression is only available over the parameter servers (PUSHPULL_BACKEND=ps)")
        self._comms: dict[str, Comm] = dict(comms or ({comm.backend: comm} if comm is not None else {}))
        have = tuple(self._comms) if (comms or comm is not None) else auto_plan.BACKENDS
        # a sum of compressed gradients needs the servers' decompress-sum-recompress
        self.backends = tuple(sorted((b for b in have if b == "ps" or not compression), key=lambda b: b != start))
        self.warmup_steps = int(warmup_steps or cfg.strategy_warmup_steps)
        self.confirm_steps = int(confirm_steps)
        if self.warmup_steps < 1 or self.confirm_steps < 2:
            raise ValueError(f"auto: warmup_steps must be >= 1 and confirm_steps >= 2, got {self.warmup_steps}, "
                             f"{self.confirm_steps}")
        self.tolerance = float(tolerance)
        self.only = [c.strip() for c in candidates.split(",")] if isinstance(candidates, str) else candidates
        self.probe_bytes = int(probe_bytes)
        _check_candidates(self.only, self.backends)
        self.compression = compression
        super().__init__(compression, comm=self._comm(start), **options)
        self.phase = "measure"
        self.decision: dict = {"phase": "measure"}
        self._delegates: dict[tuple, Strategy] = {}
        self.current = self._delegate({"backend": start, "strategy": "wfbp", "partition_bytes": 0,
                                       "credit_bytes": 0})
        self._choice = self._runner = None
        self.step = 0
        self._phase_times: list[float] = []
        self._times: dict[str, list[float]] = {}
        self._sizes: dict[str, int] = {}
        self._dtypes: dict[str, str] = {}
        self._gaps: list[float] = []
        # measure phase: gradients wait for the end of the backward. Submitted as they became ready, their
        # reductions took the cores the backward needed wherever the CPU is the limit (10 Gbit/s on 2 shared
        # cores: a 16 ms compute measured as 252 ms), and every prediction inherited the error
        self._held: list = []
        self._layerwise = False
        self._open = False          # backward done, step not closed yet
        self._t_first = None        # first gradient of the step
        self._t_bwd = None          # previous backward's end
        self._t_end = None          # previous step's end
        self._blocked = 0.0         # time blocked on reductions (or deciding) since the backward's end
        self._names_now: set = set()
        self._names_closed: set = set()

    # ------------------------------------------------------------ delegates --
    def _comm(self, backend: str) -> Comm:
        if backend not in self._comms:
            self._comms[backend] = make_comm(backend, self.compression if backend == "ps" else None)
        return self._comms[backend]

    def _delegate(self, c: dict) -> Strategy:
        from pushpull.torch.executors import make_strategy

        key = (c["backend"], c["strategy"], int(c["partition_bytes"]), int(c["credit_bytes"]))
        st = self._delegates.get(key)
        if st is not None:
            return st
        comm, opts = self._comm(c["backend"]), {}
        if c["strategy"] == "bytescheduler":
            opts = {"partition_bytes": key[2], "credit": key[3]}
            if c["backend"] == "ps" and key[2] != _engine_partition_bytes():
                comm = _Renamed(comm, f"@p{key[2]}")
        if c["strategy"] == "mgwfbp":
            opts = {"alpha": float(c.get("alpha", 0.0)), "beta": float(c.get("beta", 0.0))}
        st = make_strategy(c["strategy"], compression=self.compression if c["backend"] == "ps" else None,
                           comm=comm, **opts)
        if c["strategy"] in PLANNED:
            st.plan_now(self._times, self._sizes)  # a broadcast: every rank is here at the same step
        self._delegates[key] = st
        return st

    def scheduling(self) -> tuple[int, int]:
        cur = getattr(self, "current", None)
        return cur.scheduling() if cur is not None else self.comm.default_scheduling()

    # ------------------------------------------------------------ strategy --
    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        if self._open:  # no wait_all since the last backward: layer-wise updates; its reductions are back
            self._layerwise = True
            self.current.wait_all()
            self._end_step()
        now = time.perf_counter()
        if self._t_first is None:
            self._t_first = now
            if self.phase == "measure" and self._t_bwd is not None:
                self._gaps.append(max(0.0, now - self._t_bwd - self._blocked))
        if self.phase == "measure":
            self._times.setdefault(name, []).append(now - self._t_first)
            self._sizes[name] = grad.numel() * grad.element_size()
            self._dtypes[name] = str(grad.dtype).replace("torch.", "")
        self._names_now.add(name)
        if self.phase == "measure":  # held to the end of the backward: its ready times are the compute's own
            self._held.append((name, grad, priority))
            return
        self.current.on_ready(name, grad, priority)

    def reset(self) -> None:
        """Elastic training dropped the step in progress: the delegate forgets it, and so does the timing
        (the measurements and confirmations of the steps before stay)."""
        super().reset()
        self.current.reset()
        self._t_first, self._open, self._blocked = None, False, 0.0
        self._names_now.clear()
        self._held.clear()

    def on_backward_done(self) -> None:
        held, self._held = self._held, []
        for name, grad, priority in held:
            self.current.on_ready(name, grad, priority)
        self.current.on_backward_done()
        self._t_bwd, self._blocked, self._t_first, self._open = time.perf_counter(), 0.0, None, True

    def wait_all(self) -> None:
        t0 = time.perf_counter()
        self.current.wait_all()
        self._blocked += time.perf_counter() - t0
        if self._open:
            self._end_step()

    def wait(self, name: str) -> None:
        if name in self._names_closed and name not in self._names_now:
            return  # reduced in a step that is closed (its delegate may be gone)
        t0 = time.perf_counter()
        self.current.wait(name)
        self._blocked += time.perf_counter() - t0

    def done(self, name: str) -> bool:
        if name in self._names_closed and name not in self._names_now:
            return True
        return self.current.done(name)

    def pending(self) -> int:
        return self.current.pending()

    # ------------------------------------------------------------ the steps --
    def _end_step(self) -> None:
        t0 = time.perf_counter()
        self._open = False
        self._names_closed, self._names_now = self._names_now, set()
        self.step += 1
        if self._t_end is not None and self.phase != "final":
            self._phase_times.append(t0 - self._t_end)
        n = len(self._phase_times)
        if self.phase == "measure" and self.step >= self.warmup_steps + 1:
            self._decide()
        elif self.phase == "confirm" and n >= self.confirm_steps:
            self._confirm()
        elif self.phase == "runner_up" and n >= self.confirm_steps:
            self._settle()
        self._t_end = time.perf_counter()  # deciding is not part of any step
        self._blocked += self._t_end - t0

    def phase_time(self, phase: str, times: list[float]) -> float:
        """Median step time of a phase; after a switch the first step is dropped (new keys, plans)."""
        use = times if phase == "measure" else times[1:]
        return statistics.median(use or times)

    def _switch(self, c: dict, phase: str) -> None:
        self.current = self._delegate(c)
        self.phase = self.decision["phase"] = phase
        self._phase_times = []

    def _broadcast(self, values: list[float], what: str) -> list[float]:
        vec = torch.tensor([float(self.step)] + [float(v) for v in values], dtype=torch.float64)
        got = self.comm.broadcast_from_root(vec, f"auto.{what}").tolist()
        if int(got[0]) != self.step:
            raise RuntimeError(f"auto: rank {ops.rank()} is at step {self.step}, rank 0 decided ({what}) at step "
                               f"{int(got[0])}; every worker must run the same steps")
        return got[1:]

    # ------------------------------------------------------------ measure + decide --
    def probe(self, backend: str, nbytes: int) -> dict:
        """Time the three probes over ``backend`` (a collective: every rank runs it)."""
        comm = self._comm(backend)
        sched = tuple(comm.default_scheduling())
        if Strategy._applied.get(comm.scope()) != sched:
            comm.set_scheduling(*sched)
            Strategy._applied[comm.scope()] = sched
        big, one = torch.zeros(max(1, nbytes // 4)), torch.zeros(1)
        small = [torch.zeros(1024) for _ in range(16)]

        def reduce(t, name):
            comm.wait(comm.submit(t, name, 0))

        def stream():
            for tok in [comm.submit(t, f"auto.probe.stream.{i}", 0) for i, t in enumerate(small)]:
                comm.wait(tok)

        return {"probe_bytes": big.numel() * 4,
                "t_probe": _median_time(lambda: reduce(big, f"auto.probe.{big.numel()}"), 3),
                "t_small": _median_time(lambda: reduce(one, "auto.probe.one"), 5),
                "t_stream": _median_time(stream, 3) / len(small)}

    def shape(self) -> tuple[int, int, bool]:
        """Workers, servers, and whether a server shares this worker's host."""
        eng = ops.engine()
        return ops.size(), int(getattr(eng, "num_servers", 0) or ops.config().num_server or 1), _colocated()

    def candidates_from(self, links: dict[str, dict]) -> tuple[list[dict], dict]:
        """Rank 0: the candidates, fastest first, and what they were predicted from."""
        cfg = ops.config()
        names = sorted(self._times, key=lambda n: (statistics.median(self._times[n][1:] or self._times[n]), n))
        ready = [statistics.median(self._times[n][1:] or self._times[n]) for n in names]
        fwd = statistics.median(self._gaps) if self._gaps else 0.0
        prof = auto_plan.measured_profile(names, ready, [self._sizes[n] for n in names], fwd,
                                          [self._dtypes[n] for n in names])
        workers, servers, coloc = self.shape()
        try:
            cpu = auto_plan.host_cpu(cfg.host_probe, cfg.shared_cores, cfg.auth, data_lane_on(cfg))
        except (OSError, ValueError) as e:
            log.warning("auto: PUSHPULL_HOST_PROBE=%s not used: %s", cfg.host_probe, e)
            cpu = None
        clusters = {b: auto_plan.fit_cluster(b, workers, servers, colocated=coloc,
                                             ps_partition_bytes=_engine_partition_bytes(), cpu=cpu, **links[b])
                    for b in self.backends}
        cands = auto_plan.rank_candidates(prof, clusters, self._layerwise, cfg.fusion_threshold_bytes,
                                          cfg.fusion_cycle_ms / 1e3)
        model = {"gradients": len(names), "bytes": prof.nbytes, "backward_s": ready[-1] if ready else 0.0,
                 "forward_s": fwd, "layerwise": self._layerwise, "servers": servers, "colocated": coloc,
                 "cpu": None if cpu is None else dict(cpu.__dict__)}
        fitted = {b: {**links[b], "bandwidth_bytes_s": c.bandwidth, "latency_s": c.latency,
                      "message_s": c.message_s} for b, c in clusters.items()}
        return auto_plan.allowed(cands, self.only), {"model": model, "links": fitted, "candidates": cands}

    def _decide(self) -> None:
        warm = self.phase_time("measure", self._phase_times)
        nbytes = min(sum(self._sizes.values()), self.probe_bytes)
        links = {b: self.probe(b, nbytes) for b in self.backends}
        vec = [0.0] * (1 + 2 * len(_FIELDS))
        if ops.rank() == 0:
            cands, why = self.candidates_from(links)
            best, runner = auto_plan.choose(cands)
            self.decision.update(why)
            vec = [warm] + _encode(best) + _encode(runner)
        got = self._broadcast(vec, "decide")
        k = len(_FIELDS)
        self._choice, self._runner = _decode(got[1:1 + k]), _decode(got[1 + k:])
        self.decision.update({"warmup_step_s": got[0], "choice": self._choice, "runner_up": self._runner,
                              "decided_at_step": self.step, "measured": {}})
        if ops.rank() == 0:
            log.info("auto: chose %s (predicted %.1f ms/step), runner-up %s; warm-up (wfbp over %s) %.1f ms/step; "
                     "%s", _label(self._choice), self._choice["predicted_s"] * 1e3, _label(self._runner),
                     self.backends[0], got[0] * 1e3, _why(self.decision))
        self._switch(self._choice, "confirm")

    def _confirm(self) -> None:
        t = self.phase_time("confirm", self._phase_times)
        keep = 1.0
        if ops.rank() == 0:
            ok = t <= self._choice["predicted_s"] * (1 + self.tolerance) or t <= self.decision["warmup_step_s"]
            # another backend is always measured: a prediction across backends can be off by more than the
            # difference it reports (the ring predicted at 3x its real step on 2 shared cores at 10 Gbit/s)
            across = self._runner is not None and self._runner["backend"] != self._choice["backend"]
            keep = 1.0 if (ok and not across) or self._runner is None else 0.0
        keep, t = self._broadcast([keep, t], "confirm")
        self.decision["measured"]["choice"] = t
        if keep:
            pred, warm = self._choice["predicted_s"], self.decision["warmup_step_s"]
            why = (f"within {self.tolerance:.0%} of the predicted {pred * 1e3:.1f}" if t <= pred * (1 + self.tolerance)
                   else f"faster than the warm-up's {warm * 1e3:.1f}" if t <= warm else "no runner-up")
            self._final(self._choice, "choice", f"measured {t * 1e3:.1f} ms/step, {why}")
            return
        if ops.rank() == 0:
            log.info("auto: %s measured %.1f ms/step (predicted %.1f, warm-up %.1f): measuring the runner-up %s",
                     _label(self._choice), t * 1e3, self._choice["predicted_s"] * 1e3,
                     self.decision["warmup_step_s"] * 1e3, _label(self._runner))
        self._switch(self._runner, "runner_up")

    def _settle(self) -> None:
        t = self.phase_time("runner_up", self._phase_times)
        pick = 0.0
        if ops.rank() == 0:
            pick = 1.0 if t < self.decision["measured"]["choice"] else 0.0
        pick, t = self._broadcast([pick, t], "settle")
        self.decision["measured"]["runner_up"] = t
        m = self.decision["measured"]
        why = f"measured {m['choice'] * 1e3:.1f} ms/step against the runner-up's {t * 1e3:.1f}"
        if pick:
            self._final(self._runner, "runner_up", why)
        else:
            self._final(self._choice, "choice", why)

    def _final(self, c: dict, which: str, why: str) -> None:
        self._switch(c, "final")
        self.decision.update({"final": c, "kept": which, "reason": why, "final_at_step": self.step})
        if ops.rank() == 0:
            log.info("auto: keeping %s (%s): %s", _label(c), which, why)

    def describe_plan(self) -> str:
        d = self.decision
        if "final" in d:
            return f"auto: {_label(d['final'])} ({d['kept']}; {d['reason']})"
        if "choice" in d:
            return f"auto: trying {_label(d['choice'])} (phase {self.phase})"
        return f"auto: measuring (step {self.step} of {self.warmup_steps + 1})"


def _check_candidates(only, backends) -> None:
    """Refuse, on every rank at once, a ``candidates`` list that leaves nothing to choose."""
    if not only:
        return
    fake = [{"backend": b, "strategy": s} for b in backends for s in auto_plan.STRATEGIES]
    bad = [c for c in only if not auto_plan.allowed(fake, [c])]
    if bad or not auto_plan.allowed(fake, only):
        raise ValueError(f"auto: candidates {bad or only} match no backend:strategy among "
                         f"{', '.join(backends)} x {', '.join(auto_plan.STRATEGIES)}")


# ---------------------------------------------------------------- the decision as numbers --
_FIELDS = ("backend", "strategy", "partition_bytes", "credit_bytes", "alpha", "beta", "predicted_s")


def _encode(c: dict | None) -> list[float]:
    if c is None:
        return [-1.0] * len(_FIELDS)
    return [float(auto_plan.BACKENDS.index(c["backend"])), float(auto_plan.STRATEGIES.index(c["strategy"])),
            float(c["partition_bytes"]), float(c["credit_bytes"]), float(c.get("alpha", 0.0)),
            float(c.get("beta", 0.0)), float(c["predicted_s"])]


def _decode(v: list[float]) -> dict | None:
    if v[0] < 0:
        return None
    c = dict(zip(_FIELDS, v))
    c["backend"] = auto_plan.BACKENDS[int(v[0])]
    c["strategy"] = auto_plan.STRATEGIES[int(v[1])]
    c["partition_bytes"], c["credit_bytes"] = int(v[2]), int(v[3])
    if c["strategy"] != "mgwfbp":
        del c["alpha"], c["beta"]
    return c


def _label(c: dict | None) -> str:
    if c is None:
        return "none"
    s = f"{c['backend']}:{c['strategy']}"
    if c["strategy"] == "bytescheduler":
        credit = "inf" if c["credit_bytes"] >= auto_plan.UNLIMITED else f"{c['credit_bytes']}"
        s += f"(partition {c['partition_bytes']} B, credit {credit} B)"
    return s


def _why(d: dict) -> str:
    m = d.get("model", {})
    links = "; ".join(f"{b}: {v['bandwidth_bytes_s'] * 8 / 1e6:.0f} Mbit/s effective, {v['message_s'] * 1e3:.2f} "
                      f"ms/message, latency {v['latency_s'] * 1e3:.2f} ms ({v['probe_bytes']} B in "
                      f"{v['t_probe'] * 1e3:.1f} ms)" for b, v in d.get("links", {}).items())
    top = ", ".join(f"{_label(c)} {c['predicted_s'] * 1e3:.1f}" for c in d.get("candidates", [])[:6])
    return (f"model: {m.get('gradients')} gradients, {m.get('bytes', 0) / 1e6:.2f} MB, forward {m.get('forward_s', 0) * 1e3:.1f}"
            f" ms, backward {m.get('backward_s', 0) * 1e3:.1f} ms, layer-wise {m.get('layerwise')}; links: {links}; "
            f"predicted ms/step: {top}")
