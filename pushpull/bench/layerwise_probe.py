"""The layer-wise probe: what the optimizers cost the training thread with communication taken out.

Why a module of its own: the probe needs a fake Comm (:class:`_ProbeComm`, reductions that cost nothing) that
belongs to no real job; every grid job runs it before its timed steps (:mod:`pushpull.bench.grid_child`), and
``benchmarks/layerwise_probe.py`` runs it alone.
"""
from __future__ import annotations

import os
import socket
import statistics
import time


class _ProbeToken:
    __slots__ = ("event", "t_set")

    def __init__(self) -> None:
        import threading

        self.event = threading.Event()
        self.t_set = 0.0


class _ProbeComm:
    """A Comm whose reductions cost nothing: ``poll`` says not back yet (so, as in a communication-bound
    run, ScheduledOptimizer applies every update in its layer's forward pre-hook, not in ``step()``) and
    ``wait`` returns at once, or, with ``handoff``, blocks until a helper thread completes the reduction
    (the reply arriving on the I/O thread) and records how long the waiter took to resume."""

    def __init__(self, backend: str, handoff: bool = False):
        self.backend = backend
        self.handoff = handoff
        self.wakes: list[float] = []
        self._q = None
        if handoff:
            import queue
            import threading

            self._q = queue.Queue()
            threading.Thread(target=self._completer, name="probe-completer", daemon=True).start()

    def _completer(self) -> None:
        while True:
            tok = self._q.get()
            if tok is None:
                return
            time.sleep(2e-4)                 # let the waiter block first
            tok.t_set = time.perf_counter()
            tok.event.set()

    def close(self) -> None:
        if self._q is not None:
            self._q.put(None)

    def submit(self, tensor, name, priority, average=True):
        return _ProbeToken()

    def poll(self, token) -> bool:
        return False

    def wait(self, token) -> None:
        if not self.handoff:
            return
        self._q.put(token)
        token.event.wait()
        self.wakes.append(time.perf_counter() - token.t_set)

    def set_scheduling(self, partition_bytes: int, credit_bytes: int) -> None:
        pass

    def default_scheduling(self) -> tuple[int, int]:
        return 0, 0

    def scope(self):
        return id(self)


def layerwise_probe(model: str, size_scale: float = 1.0, base: str = "bytescheduler", backend: str = "ps",
                    iters: int = 20, warmup: int = 3) -> dict:
    """What the optimizer costs the training thread, with communication taken out.

    The emulated model (:mod:`pushpull.bench.emulated_model`) with no compute (no sleeps) and the
    cell's tensors runs ``iters`` steps in this process: with no optimizer (zero_grad, forward,
    backward: the baseline), with ``DistributedOptimizer`` and with ``ScheduledOptimizer`` over the
    same ``base`` strategy and a Comm whose reductions are free (:class:`_ProbeComm`: never back at
    ``step()``, so every layer-wise update is applied in its layer's forward pre-hook, as in a
    communication-bound run), and ScheduledOptimizer again with every reduction completed by a helper
    thread once the training thread blocks on it. Returns seconds, each a median over the steps:

    * ``update_lw_s``: per tensor, ScheduledOptimizer's forward pre-hooks (wait bookkeeping, the
      parameter's own optimizer step), i.e. the forward's time over the baseline's, over the tensors;
    * ``step_lw_s``: per iteration, ScheduledOptimizer's ``step()`` (submits nothing new, applies
      nothing: no reduction is back);
    * ``step_s``: per iteration, DistributedOptimizer's ``step()``: ``wait_all`` over every reduction
      (all back) and one optimizer step over all parameters;
    * ``bwd_lw_s``, ``bwd_s``: per iteration, the backward's time over the baseline's (the gradient
      hooks that submit reductions);
    * ``wake_s``: time from a reduction's completion on another thread to the blocked training thread
      running again (once per layer whose update the forward waits for);
    * ``tensors``, ``layers``, ``iters`` and the baseline's phases.

    One process, no sockets: this machine's CPU cost of the code paths under its current load. The
    grid runs it in every worker at once before a job's timed steps, so under the cell's load.
    """
    import torch

    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.profiles import load_profile
    from pushpull.torch import ops
    from pushpull.torch.executors import make_strategy
    from pushpull.torch.optimizer import DistributedOptimizer
    from pushpull.torch.scheduled import ScheduledOptimizer

    prof = load_profile(model)
    x = torch.zeros(1)
    real_size = ops.size
    ops.size = lambda: max(2, real_size())   # the optimizers' distributed code paths, in one process
    med = statistics.median
    try:
        def run(kind: str, handoff: bool = False) -> dict:
            m = EmulatedModel(prof, 0.0, size_scale)
            named = [(f"probe.{kind}.{n}", p) for n, p in m.named_parameters()]
            sgd = torch.optim.SGD(m.parameters(), lr=0.0)
            comm = _ProbeComm(backend, handoff)
            opt = sgd
            if kind != "none":
                st = make_strategy(base, comm=comm)
                if kind == "lw":
                    opt = ScheduledOptimizer(m, sgd, named_parameters=named, strategy=st)
                else:
                    opt = DistributedOptimizer(sgd, named_parameters=named, strategy=st, model=m)
            ph: dict[str, list[float]] = {"fwd": [], "bwd": [], "step": []}
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                opt.zero_grad()
                out = m(x)
                t1 = time.perf_counter()
                out.sum().backward()
                t2 = time.perf_counter()
                if kind != "none":
                    opt.step()
                t3 = time.perf_counter()
                if i >= warmup:
                    for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("step", t3 - t2)):
                        ph[k].append(v)
            if kind == "lw":
                opt.synchronize()
                opt.remove_hooks()
            comm.close()
            n = sum(1 for _ in m.parameters())
            out = {k: med(v) for k, v in ph.items()}
            out["n"] = n
            out["wakes"] = comm.wakes[warmup * n:]
            return out

        none, dist, lw = run("none"), run("dist"), run("lw")
        wakes = run("lw", handoff=True)["wakes"]
    finally:
        ops.size = real_size
    n = none["n"]
    return {"model": model, "size_scale": size_scale, "base": base, "backend": backend, "tensors": n,
            "layers": len(prof.layers), "iters": iters,
            "update_lw_s": max(0.0, (lw["fwd"] - none["fwd"]) / n), "step_lw_s": lw["step"], "step_s": dist["step"],
            "bwd_lw_s": max(0.0, lw["bwd"] - none["bwd"]), "bwd_s": max(0.0, dist["bwd"] - none["bwd"]),
            "wake_s": med(wakes) if wakes else None, "base_fwd_s": none["fwd"], "base_bwd_s": none["bwd"],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": socket.gethostname(), "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg())}

