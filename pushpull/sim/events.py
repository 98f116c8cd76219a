"""The discrete-event simulation: one training iteration's communication, then
the steady-state iteration built around it.

Why one communication phase is enough: the backward pass never waits for
the network, so the ready times of an iteration's gradients (relative to
the start of its backward) are the same every iteration; and the next
backward only starts after every layer's forward, which waits for that
layer's reduced gradient, so the network, the servers and the codec are
idle whenever a backward starts. The communication phase is therefore
identical (shifted in time) in every iteration: it is simulated once, event
by event, and the iterations -- forward passes gated by the previous
iteration's layer-wise updates -- are laid out around it. The reported
iteration is the last of ``iterations``; from the second one on they are all
the same.

Events of the communication phase: a task is released by the strategy,
admitted by the queue discipline (priority and credit), compressed on the
worker's codec (FIFO), then either pushed piece by piece over the PS network
(fluid, :mod:`pushpull.sim.network`), summed on its server (FIFO at
``sum_rate`` once all n pushes arrived), and pulled back; or reduced by the
sequential ring. It is decompressed, its bytes are credited back, and a
layer whose every byte has come back is updated.

All-reduce as the backend runs it (:mod:`pushpull.torch.allreduce_backend`):
rank 0's dispatcher admits, in one pass, everything admissible (priority and
credit) and announces it in one order message
(:meth:`~pushpull.sim.config.ClusterConfig.order_message_s`); what is
released meanwhile waits for the next pass. The batch's tasks are grouped
into collectives by the runtime's own fusion rule
(:func:`pushpull.policy.collective_fusion.fuse_groups`), and each collective
takes one per-message CPU stage and one ring reduction of its bytes.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pushpull.policy.base import key_sizes
from pushpull.policy.collective_fusion import fuse_groups
from pushpull.profiles import LayerProfile, Profile
from pushpull.sim.config import ClusterConfig, Compression, SimOptions
from pushpull.sim.executors import CommTask, ReadyTensor, Strategy, StrategyContext, make_strategy
from pushpull.sim.network import INF, Message, PSNetwork, Ring
from pushpull.timeline import TraceWriter


# ---------------------------------------------------------------------------
# result
# ---------------------------------------------------------------------------

@dataclass
class SimResult:
    """Prediction for one (profile, cluster, strategy)."""
    model: str
    strategy: str
    backend: str
    workers: int
    servers: int
    replicas: int
    bandwidth: float
    batch_size: int
    iteration_s: float          # steady-state iteration time
    compute_s: float            # forward + backward of one worker
    fwd_s: float
    bwd_s: float
    exposed_comm_s: float       # iteration time not covered by compute
    comm_span_s: float          # first admission .. last reduced byte, per iteration
    n_tasks: int
    layer_update_s: list[float] # per layer, after the start of the backward (-inf: no params)
    iterations: int = 3
    n_collectives: int = 0      # all-reduce: collectives per iteration after fusion (0 for PS)
    _trace: dict = field(default_factory=dict, repr=False)

    @property
    def throughput(self) -> float:
        """Samples per second over all replicas."""
        return self.replicas * self.batch_size / self.iteration_s if self.iteration_s > 0 else INF

    @property
    def overlap(self) -> float:
        """Fraction of the communication span hidden behind compute."""
        if self.comm_span_s <= 0:
            return 1.0
        return max(0.0, 1.0 - self.exposed_comm_s / self.comm_span_s)

    def to_dict(self) -> dict:
        return {
            "model": self.model, "strategy": self.strategy, "backend": self.backend,
            "workers": self.workers, "servers": self.servers, "replicas": self.replicas,
            "bandwidth_bytes_s": self.bandwidth, "batch_size": self.batch_size,
            "iteration_s": self.iteration_s, "throughput": self.throughput,
            "compute_s": self.compute_s, "exposed_comm_s": self.exposed_comm_s,
            "comm_span_s": self.comm_span_s, "overlap": self.overlap, "n_tasks": self.n_tasks,
            "n_collectives": self.n_collectives,
        }

    def write_trace(self, path: str | Path) -> Path:
        """Write ``iterations`` iterations as a Chrome trace (pushpull.timeline format)."""
        if not self._trace:
            raise ValueError("write_trace: simulate(..., trace=False) kept no events")
        return _write_trace(self, Path(path))


# ---------------------------------------------------------------------------
# communication phase
# ---------------------------------------------------------------------------

class _TaskState:
    __slots__ = ("task", "seq", "raw", "payload", "answer", "codec", "pieces_left", "acks_left", "holds_credit", "rec",
                 "layers", "dtype")

    def __init__(self, task: CommTask, seq: int, raw: int, payload: float, codec: float, layers,
                 answer: float | None = None):
        self.task, self.seq, self.raw, self.payload, self.codec = task, seq, raw, payload, codec
        self.answer = payload if answer is None else answer   # the pull's bytes
        self.pieces_left = 0
        self.acks_left = 0
        self.holds_credit = False
        self.dtype = "float32"
        self.rec: dict = {"pieces": []}
        self.layers = layers


class EventSimulation:
    """Simulates one iteration's communication; times are seconds after the
    start of the backward pass."""

    def __init__(self, profile: Profile, cluster: ClusterConfig, strategy: Strategy,
                 tasks: list[CommTask], tensor_layer: list[int], tensor_bytes: list[int],
                 keep_trace: bool = True):
        self.cluster, self.strategy = cluster, strategy
        self.disc = strategy.discipline(cluster)
        self.keep = keep_trace
        comp: Compression | None = strategy.compression
        self._events: list = []
        self._seq = 0
        self.now = 0.0
        L = len(profile.layers)
        dtypes = [t.dtype for layer in profile.layers for t in layer.tensors]   # by global tensor index
        self.layer_left = [0] * L
        self.layer_update = [-INF] * L
        for i, b in enumerate(tensor_bytes):
            self.layer_left[tensor_layer[i]] += b
        self.states: list[_TaskState] = []
        covered = [0] * len(tensor_bytes)
        for j, t in enumerate(tasks):
            raw = 0
            payload = 0.0
            answer = 0.0
            codec = 0.0
            layers: dict[int, int] = {}
            for ti, b in t.parts:
                if b <= 0:
                    raise ValueError(f"strategy {strategy.name}: task {t.name!r} carries {b} bytes of tensor {ti}")
                covered[ti] += b
                raw += b
                li = tensor_layer[ti]
                layers[li] = layers.get(li, 0) + b
                if comp is not None and comp.applies(tensor_bytes[ti]):
                    payload += b / comp.ratio
                    answer += b / comp.pull_ratio
                    codec += b
                else:
                    payload += b
                    answer += b
            st = _TaskState(t, j, raw, payload, codec, layers, answer)
            kinds = {dtypes[ti] for ti, _ in t.parts}
            st.dtype = kinds.pop() if len(kinds) == 1 else "mixed"   # a mixed buffer fuses with nothing
            self.states.append(st)
        for ti, (c, b) in enumerate(zip(covered, tensor_bytes)):
            if c != b:
                raise ValueError(f"strategy {strategy.name}: tensor {ti} has {b} bytes but its tasks "
                                 f"carry {c}")
        self.comp = comp
        self.queue: list = []
        self.inflight = 0
        self.codec_free = 0.0
        self.msg_free = 0.0          # the worker's per-message CPU stage (ClusterConfig.message_s)
        self.admissions: list[tuple[float, int, int]] = []   # (t, inflight before, bytes)
        n, k = cluster.workers, cluster.servers
        if cluster.backend == "ps":
            # flat path with several processes per machine: every NIC carries local_size copies
            share = 1 if cluster.local_reduce else cluster.local_size
            self.net = PSNetwork(n, k, cluster.bandwidth / share, cluster.server_bandwidth / share,
                                 cluster.colocated, cpu=cluster.cpu)
            self.server_free = [0.0] * k
            self.server_load = [0.0] * k
        else:
            self.net = None
            self.ring = Ring(n, cluster.bandwidth, cluster.latency, cpu=cluster.cpu)
        self.dispatching = False     # all-reduce: rank 0's dispatcher is in a pass (its order message)
        self.admitting = False
        self.to_dispatch: list[_TaskState] = []   # admitted (and compressed), waiting for the next pass
        self.collectives = 0

    # -- event plumbing -------------------------------------------------------
    def at(self, t: float, fn: Callable, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn, args))

    def run(self) -> None:
        for st in self.states:
            self.at(st.task.release_s, self._release, st)
        net = self.net
        while True:
            t_ev = self._events[0][0] if self._events else INF
            t_net = net.next_time() if net is not None else INF
            if t_ev == INF and t_net == INF:
                break
            if t_net <= t_ev:
                self.now = t_net
                net.advance_to(t_net)
            else:
                _, _, fn, args = heapq.heappop(self._events)
                self.now = t_ev
                if net is not None:
                    net.advance_to(t_ev)
                fn(*args)
        if net is not None and net.busy():  # pragma: no cover - a bug, not a user error
            raise RuntimeError("simulator: network still busy when no event is left")
        left = [st.task.name for st in self.states if "done" not in st.rec]
        if left:  # pragma: no cover
            raise RuntimeError(f"simulator: tasks never completed: {left[:5]}")

    # -- queue discipline -------------------------------------------------------
    def _release(self, st: _TaskState) -> None:
        st.rec["release"] = self.now
        key = st.task.priority if self.disc.by_priority else ()
        heapq.heappush(self.queue, (key, st.task.release_s, st.seq, st))
        self._admit()

    def _admit(self) -> None:
        if self.net is None and self.dispatching:
            return   # all-reduce: rank 0 admits when its dispatcher comes round for the next batch
        credit = self.disc.credit_bytes
        self.admitting = True
        while self.queue and (credit is None or self.inflight < credit):
            st = heapq.heappop(self.queue)[-1]
            self.admissions.append((self.now, self.inflight, st.raw))
            self.inflight += st.raw
            st.holds_credit = True
            st.rec["admit"] = self.now
            st.rec["order"] = len(self.admissions) - 1
            self._compress(st)
        self.admitting = False
        if self.net is None:
            self._dispatch()

    # -- the all-reduce backend's dispatcher -------------------------------------
    def _dispatch(self) -> None:
        """Start a pass over what was admitted: one order message, then the batch's collectives."""
        if self.dispatching or self.admitting or not self.to_dispatch:
            return
        batch, self.to_dispatch = self.to_dispatch, []
        self.dispatching = True
        for st in batch:
            st.rec["dispatch"] = self.now
        self.at(self.now + self.cluster.order_message_s(), self._issue, batch)

    def _issue(self, batch: list[_TaskState]) -> None:
        """The batch's collectives in admission order, small tasks fused by the runtime's rule."""
        for g in fuse_groups([(st.raw, st.dtype) for st in batch]):
            members = [batch[i] for i in g]
            go = self._message_cpu()
            s, e = self.ring.reserve(go, sum(st.payload for st in members))
            self.collectives += 1
            for st in members:
                if go > self.now:
                    st.rec["cpu"] = (go - self.cluster.message_s, go)
                st.rec["allreduce"] = (s, e)
                st.rec["fused"] = len(members)
                self.at(e, self._finish, st)
        self.dispatching = False
        self._admit()

    # -- codec ------------------------------------------------------------------
    def _codec(self, seconds: float) -> tuple[float, float]:
        start = max(self.now, self.codec_free)
        self.codec_free = start + seconds
        return start, self.codec_free

    def _compress(self, st: _TaskState) -> None:
        c = self.comp
        if c is not None and st.codec > 0 and c.compress_s_per_byte > 0:
            s, e = self._codec(st.codec * c.compress_s_per_byte)
            st.rec["compress"] = (s, e)
            self.at(e, self._send, st)
        else:
            self._send(st)

    def _finish(self, st: _TaskState) -> None:
        c = self.comp
        if c is not None and st.codec > 0 and c.decompress_s_per_byte > 0:
            s, e = self._codec(st.codec * c.decompress_s_per_byte)
            st.rec["decompress"] = (s, e)
            self.at(e, self._done, st)
        else:
            self._done(st)

    def _return_credit(self, st: _TaskState) -> None:
        if st.holds_credit:
            st.holds_credit = False
            self.inflight -= st.raw
            st.rec["credit"] = self.now
            self._admit()

    def _done(self, st: _TaskState) -> None:
        st.rec["done"] = self.now
        for li, b in st.layers.items():
            self.layer_left[li] -= b
            if self.layer_left[li] == 0:
                self.layer_update[li] = self.now
        self._return_credit(st)

    def _message_cpu(self) -> float:
        """Reserve the worker's per-message CPU stage; returns when the message may go."""
        c = self.cluster.message_s
        if c <= 0:
            return self.now
        start = max(self.now, self.msg_free)
        self.msg_free = start + c
        return self.msg_free

    # -- backends ---------------------------------------------------------------
    def _send(self, st: _TaskState) -> None:
        st.rec["send"] = self.now
        if self.net is None:
            self.to_dispatch.append(st)
            self._dispatch()
            return
        cl = self.cluster
        sizes = key_sizes(st.raw, self.strategy.ps_key_bytes(cl)) or [st.raw]
        st.pieces_left = len(sizes)
        st.acks_left = len(sizes)
        for raw in sizes:
            frac = raw / st.raw
            # balanced by bytes: the least-loaded server takes the piece
            s = min(range(cl.servers), key=lambda i: (self.server_load[i], i))
            self.server_load[s] += raw
            piece = {"server": s, "raw": raw, "payload": st.payload * frac, "answer": st.answer * frac,
                     "codec": st.codec * frac}
            st.rec["pieces"].append(piece)
            go = self._message_cpu()
            if go > self.now:
                piece["cpu"] = (go - cl.message_s, go)
                self.at(go, self._push, st, piece)
            else:
                self._push(st, piece)

    def _push(self, st: _TaskState, piece: dict) -> None:
        msg = Message(piece["payload"], lambda t, st=st, p=piece: self._pushed(st, p, t))
        msg.tag = piece
        piece["push_enq"] = self.now
        self.net.send(("push", piece["server"]), msg)
        piece["msg"] = msg

    def _pushed(self, st: _TaskState, piece: dict, t: float) -> None:
        lat = self.cluster.latency
        piece["push"] = (piece["msg"].started, t + lat)
        self.at(t + lat, self._sum, st, piece)
        if self.disc.credit_release == "push":
            self.at(t + 2 * lat, self._push_acked, st)   # the acknowledgement travels back

    def _push_acked(self, st: _TaskState) -> None:
        st.acks_left -= 1
        if st.acks_left == 0:
            self._return_credit(st)

    def _sum(self, st: _TaskState, piece: dict) -> None:
        cl = self.cluster
        n, s = cl.workers, piece["server"]
        secs = 0.0
        if cl.sum_rate is not None:
            secs += n * piece["raw"] / cl.sum_rate
        c = self.comp
        if c is not None and piece["codec"] > 0:
            secs += piece["codec"] * (n * c.decompress_s_per_byte + c.compress_s_per_byte)
        if secs > 0:
            start = max(self.now, self.server_free[s])
            self.server_free[s] = start + secs
            piece["sum"] = (start, start + secs)
            self.at(start + secs, self._pull, st, piece)
        else:
            self._pull(st, piece)

    def _pull(self, st: _TaskState, piece: dict) -> None:
        msg = Message(piece["answer"], lambda t, st=st, p=piece: self._pulled(st, p, t))
        piece["msg"] = msg
        self.net.send(("pull", piece["server"]), msg)

    def _pulled(self, st: _TaskState, piece: dict, t: float) -> None:
        piece["pull"] = (piece["msg"].started, t + self.cluster.latency)
        del piece["msg"]
        self.at(t + self.cluster.latency, self._piece_back, st)

    def _piece_back(self, st: _TaskState) -> None:
        st.pieces_left -= 1
        if st.pieces_left == 0:
            self._finish(st)


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------

def _scaled(profile: Profile, f: float) -> Profile:
    if f == 1.0:
        return profile
    if f == 0.0:
        return Profile(profile.model, [LayerProfile(l.name, 0.0, 0.0, list(l.tensors)) for l in profile.layers],
                       profile.batch_size, profile.device, profile.source)
    return profile.scaled(f)


def ready_stream(profile: Profile) -> tuple[list[ReadyTensor], list[float]]:
    """Gradients in the order the backward produces them, with ready times."""
    L = len(profile.layers)
    first = [0] * L
    acc = 0
    for li, layer in enumerate(profile.layers):
        first[li] = acc
        acc += len(layer.tensors)
    ready: list[ReadyTensor] = []
    layer_ready = [0.0] * L
    t = 0.0
    for li in range(L - 1, -1, -1):
        layer = profile.layers[li]
        t += layer.bwd_s
        layer_ready[li] = t
        for pos in range(len(layer.tensors) - 1, -1, -1):
            ts = layer.tensors[pos]
            ready.append(ReadyTensor(first[li] + pos, li, pos, ts.name, ts.nbytes, ts.numel, t))
    return ready, layer_ready


def simulate(profile: Profile, cluster: ClusterConfig, strategy: "Strategy | str" = "wfbp", *,
             layerwise_update: bool = True, iterations: int = 3, compute_scale: float = 1.0,
             trace: bool = True, compute_clock: str = "sequential",
             options: SimOptions | None = None) -> SimResult:
    """Predict the steady-state iteration of ``profile`` on ``cluster`` under ``strategy``.

    ``strategy`` is a Strategy instance or a name (``bsp``, ``wfbp``,
    ``fusion``, ``mgwfbp``, ``bytescheduler``). ``compute_scale`` multiplies
    the profile's compute times; ``layerwise_update=False`` makes the next
    forward wait for every gradient instead of only its own layer's;
    ``compute_clock="deadline"`` lets the forward catch up the time it waited
    for updates (the emulated cluster's sleep replay, see SimOptions).
    """
    if options is None:
        options = SimOptions(layerwise_update=layerwise_update, iterations=iterations,
                             compute_scale=compute_scale, trace=trace, compute_clock=compute_clock)
    if not isinstance(profile, Profile):
        raise TypeError(f"profile: expected a pushpull.profiles.Profile, got {type(profile).__name__}")
    if not isinstance(cluster, ClusterConfig):
        raise TypeError(f"cluster: expected a ClusterConfig, got {type(cluster).__name__}")
    strat = make_strategy(strategy)
    prof = _scaled(profile, options.compute_scale)

    ready, layer_ready = ready_stream(prof)
    tensor_layer = [0] * len(ready)
    tensor_bytes = [0] * len(ready)
    for r in ready:
        tensor_layer[r.index] = r.layer
        tensor_bytes[r.index] = r.nbytes
    bwd = prof.bwd_s
    ctx = StrategyContext(prof, cluster, ready, layer_ready, bwd)
    tasks = strat.tasks(ctx)
    phase = EventSimulation(prof, cluster, strat, tasks, tensor_layer, tensor_bytes, keep_trace=options.trace)
    phase.run()

    # steady state: the forward after a backward that started at 0
    upd = phase.layer_update
    all_done = max([u for u in upd if u > -INF], default=-INF)
    t = bwd
    fwd_start, fwd_dur = [], []
    # "deadline": the forward's clock starts when the forward is called (at
    # once with layer-wise updates, after every update without) and layer l
    # ends no earlier than clock start + fwd of layers 0..l: time spent
    # waiting for an update is caught up, as the emulated cluster's sleep
    # replay (pushpull.bench.emulated_model) does
    # The optimizer runs on the training thread (options.update_s/step_call_s/wake_s, all 0 by default):
    # step() after the backward; without layer-wise updates it first waits for every reduction
    # (woken once if it blocked) and applies them all; with them it returns at once and each layer's
    # forward pre-hook waits for that layer's reductions (woken if it blocked) and applies its
    # tensors' updates, before the layer's forward. The deadline clock starts when the forward is
    # called, so it catches up the pre-hooks' time, not step()'s.
    o = options
    if o.layerwise_update:
        t = bwd + o.step_call_s
    else:
        t = (all_done + o.wake_s if all_done > bwd else bwd) + o.step_call_s
    clock = t
    for li, layer in enumerate(prof.layers):
        if o.layerwise_update:
            if upd[li] > t:
                t = upd[li] + o.wake_s
            t += o.update_s * len(layer.tensors)
        fwd_start.append(t - bwd)          # relative to the end of the backward
        clock += layer.fwd_s
        end = max(t, clock) if o.compute_clock == "deadline" else t + layer.fwd_s
        fwd_dur.append(end - t)
        t = end
    iteration = t                          # next backward starts at t
    compute = prof.compute_s
    admits = [st.rec["admit"] for st in phase.states]
    dones = [st.rec["done"] for st in phase.states]
    span = (max(dones) - min(admits)) if phase.states else 0.0

    res = SimResult(
        model=prof.model, strategy=strat.describe(), backend=cluster.backend,
        workers=cluster.workers, servers=cluster.servers if cluster.backend == "ps" else 0,
        replicas=cluster.replicas, bandwidth=cluster.bandwidth, batch_size=prof.batch_size,
        iteration_s=iteration, compute_s=compute, fwd_s=prof.fwd_s, bwd_s=bwd,
        exposed_comm_s=max(0.0, iteration - compute), comm_span_s=span, n_tasks=len(tasks),
        layer_update_s=list(upd), iterations=options.iterations, n_collectives=phase.collectives,
    )
    if options.trace:
        res._trace = {"profile": prof, "phase": phase, "fwd_start": fwd_start, "fwd_dur": fwd_dur,
                      "cluster": cluster}
    return res


# ---------------------------------------------------------------------------
# trace
# ---------------------------------------------------------------------------

def _write_trace(res: SimResult, path: Path) -> Path:
    """Lay out ``res.iterations`` iterations and write them with TraceWriter.

    pid 0 is the representative worker (all workers are identical), with a
    ``compute`` track and one track per task (tensor, partition or fused
    buffer; one per piece when a PS task is sharded); servers follow as pids
    1..k with their summation work.
    """
    tr = res._trace
    prof: Profile = tr["profile"]
    phase: EventSimulation = tr["phase"]
    cluster: ClusterConfig = tr["cluster"]
    fwd_start = tr["fwd_start"]
    us = 1e6
    w = TraceWriter(path, pid=0, process_name=f"worker 0 (simulated; {cluster.workers} identical workers)")
    w.track("compute")
    servers = {}
    T = res.iteration_s
    F0 = prof.fwd_s
    for it in range(res.iterations):
        # iteration 0 runs its forward ungated from t=0; later ones are gated
        b0 = F0 + it * T                     # start of this iteration's backward
        if it == 0:
            t = 0.0
            for layer in prof.layers:
                w.complete("compute", f"fwd {layer.name}", t * us, layer.fwd_s * us, cat="compute",
                           args={"iteration": it})
                t += layer.fwd_s
        t = b0
        for layer in reversed(prof.layers):
            w.complete("compute", f"bwd {layer.name}", t * us, layer.bwd_s * us, cat="compute",
                       args={"iteration": it})
            t += layer.bwd_s
        end_bwd = t
        for li, layer in enumerate(prof.layers):
            s = end_bwd + fwd_start[li]
            w.complete("compute", f"fwd {layer.name}", s * us, tr["fwd_dur"][li] * us, cat="compute",
                       args={"iteration": it + 1})
        for st in phase.states:
            rec = st.rec
            name = st.task.name
            a = {"iteration": it, "bytes": st.raw}

            def ev(track, label, s, e, cat="comm", args=a):
                w.complete(track, label, (b0 + s) * us, (e - s) * us, cat=cat, args=args)

            ev(name, "queue", rec["release"], rec["admit"], cat="queue")
            ev(name, "comm", rec["admit"], rec["done"],
               args={**a, "payload_bytes": round(st.payload), "priority": list(st.task.priority),
                     "admit_order": rec["order"]})
            if "compress" in rec:
                ev(name, "compress", *rec["compress"], cat="codec")
            if "credit" in rec:   # admission to the return of its credit
                ev(name, "credit", rec["admit"], rec["credit"], cat="credit",
                   args={**a, "admit_order": rec["order"]})
            if "cpu" in rec:
                ev(name, "cpu", *rec["cpu"], cat="cpu")
            if "allreduce" in rec:
                ev(name, "allreduce", *rec["allreduce"])
            pieces = rec["pieces"]
            for j, p in enumerate(pieces):
                track = name if len(pieces) == 1 else f"{name}#{j}"
                pa = {"iteration": it, "server": p["server"], "bytes": p["raw"]}
                if "cpu" in p:
                    ev(track, "cpu", *p["cpu"], cat="cpu", args=pa)
                ev(track, "push", *p["push"], args=pa)
                ev(track, "pull", *p["pull"], args=pa)
                if "sum" in p:
                    s = p["server"]
                    if s not in servers:
                        servers[s] = TraceWriter(None, pid=1 + s, process_name=f"server {s} (simulated)")
                    sw = servers[s]
                    sw.complete("sum", f"sum {track}", (b0 + p["sum"][0]) * us, (p["sum"][1] - p["sum"][0]) * us,
                                cat="server", args=pa)
            if "decompress" in rec:
                ev(name, "decompress", *rec["decompress"], cat="codec")
    for s in sorted(servers):
        w._events.extend(servers[s].events())
    w.flush()
    return path
