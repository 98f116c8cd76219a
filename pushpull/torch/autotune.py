"""Online auto-tuning of partition size and credit (ByteScheduler's idea) by
Bayesian optimisation with optuna.

Why online: the best partition size and credit depend on the model, the
network and the other jobs on it, so they are measured on the real job rather
than predicted. The objective is the mean step time over ``window`` steps,
after dropping ``warmup`` steps following each change (new keys, cold caches).

How it stays consistent: only rank 0 runs the optimiser. At each decision step
every worker takes part in one push_pull of a small int64 tensor
``[step, partition_bytes, credit_bytes, trial, done]`` where the others
contribute zeros (a broadcast), and every worker applies the result before its
next step. Decision steps are the same on every worker because they are
counted in steps, never in time.

What a change costs: the credit is just the engine's queue credit. A new
partition size needs new keys, so tensor names get a suffix per partition size
(``fc.weight@p65536``): the first step after a change re-declares every
tensor (one ASSIGN and one INIT per partition, a barrier per key), and servers
keep the old keys' buffers. Returning to a size already tried reuses its keys.

Search space (ByteScheduler (Peng et al., SOSP 2019), its auto-tuner's ranges): credit 1..16 M elements (4..64 M over all-reduce),
partition 2..32 M elements, both log-scaled, times ``scale``; by default
``scale = min(1, model elements / 32 M)``, so a model smaller than 32 M
elements searches partitions between 1/16 of the model and all of it.
The first trial is the configured setting (clamped into the space); then
``n_startup`` random points (the first counts among them) and ``n_trials``
model-guided ones (GP with expected improvement, or TPE).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from pushpull.config import load_config, max_partition_bytes

log = logging.getLogger("pushpull.autotune")

M = 1_000_000


@dataclass(frozen=True)
class Space:
    """Bounds in bytes (inclusive), searched on a log scale."""

    partition: tuple[int, int]
    credit: tuple[int, int]

    @classmethod
    def for_model(cls, elements: int, itemsize: int = 4, backend: str = "ps", scale: float | None = None,
                  max_partition: int | None = None) -> "Space":
        """ByteScheduler's ranges, scaled to the model (see the module docstring); partitions no larger than
        ``max_partition`` (over PS: what a server accepts in one message)."""
        if scale is None:
            scale = min(1.0, max(elements, 1) / (32 * M))
        credit_el = (1 * M, 16 * M) if backend == "ps" else (4 * M, 64 * M)

        def rng(lo_el: float, hi_el: float) -> tuple[int, int]:
            lo = max(1024, int(lo_el * scale) * itemsize)
            hi = max(2 * lo, int(hi_el * scale) * itemsize)
            return lo, hi

        part = rng(2 * M, 32 * M)
        if max_partition:
            part = (min(part[0], max_partition // 2), min(part[1], max_partition))
        return cls(part, rng(*credit_el))

    def clamp(self, partition: int, credit: int) -> tuple[int, int]:
        """``credit`` 0 (unlimited) becomes the largest credit."""
        credit = credit if credit > 0 else self.credit[1]
        return (min(max(partition, self.partition[0]), self.partition[1]),
                min(max(credit, self.credit[0]), self.credit[1]))


class Search:
    """The ask/tell loop over an optuna study; knows nothing of clusters or clocks."""

    def __init__(self, space: Space, n_startup: int = 10, n_trials: int = 15, sampler: str = "gp", seed: int = 0,
                 baseline: tuple[int, int] | None = None):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space = space
        self.budget = max(1, n_startup + n_trials)
        if sampler == "gp":
            smp = optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup, deterministic_objective=False)
        elif sampler == "tpe":
            smp = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup)
        else:
            raise ValueError(f"autotune sampler {sampler!r}: expected 'gp' or 'tpe'")
        self.study = optuna.create_study(direction="minimize", sampler=smp)
        if baseline is not None:
            p, c = space.clamp(*baseline)
            self.study.enqueue_trial({"partition_bytes": p, "credit_bytes": c})
        self._trial = None
        self.history: list[dict] = []

    def ask(self) -> dict | None:
        """The next setting to measure, or None when the budget is spent."""
        if self._trial is not None:
            raise RuntimeError("ask() twice without tell()")
        if len(self.history) >= self.budget:
            return None
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the GP's matrices are tiny; threads only contend with training
        try:
            t = self.study.ask()
        finally:
            torch.set_num_threads(threads)
        s = self.space
        self._trial = t
        return {"partition_bytes": t.suggest_int("partition_bytes", *s.partition, log=True),
                "credit_bytes": t.suggest_int("credit_bytes", *s.credit, log=True)}

    def tell(self, value: float) -> None:
        if self._trial is None:
            raise RuntimeError("tell() without ask()")
        t, self._trial = self._trial, None
        self.study.tell(t, value)
        self.history.append({"trial": t.number, **t.params, "value": value})

    @property
    def best(self) -> dict:
        """The best measured setting: ``{"partition_bytes", "credit_bytes", "value"}``."""
        b = self.study.best_trial
        return {**b.params, "value": b.value, "trial": b.number}


def apply_setting(partition_bytes: int, credit_bytes: int, base_partition_bytes: int | None = None) -> None:
    """Make the engine use these from the next push_pull on.

    A new partition size gets a new tensor-name suffix (new keys), because a
    key's partition layout is fixed at its INIT; ``base_partition_bytes`` (the
    size in force before tuning, default the configured one) keeps the plain
    names. The credit applies at once, on the I/O thread."""
    from pushpull.torch import ops

    eng = ops.engine() if ops.is_initialized() else None
    if eng is None:
        return
    base = ops.config().partition_bytes if base_partition_bytes is None else base_partition_bytes
    eng.set_scheduling(partition_bytes=int(partition_bytes), credit_bytes=int(credit_bytes))
    ops.set_name_suffix("" if partition_bytes == base else f"@p{int(partition_bytes)}")


def _broadcast_from_root(vec: list[int]) -> list[int]:
    """Rank 0's ``vec`` on every worker: a push_pull where the others add zeros."""
    from pushpull.torch import ops

    t = torch.tensor(vec if ops.rank() == 0 else [0] * len(vec), dtype=torch.int64)
    return [int(v) for v in ops.push_pull(t, average=False, name="pushpull.autotune").tolist()]


class AutoTuner:
    """Tunes partition size and credit while the job trains.

    ``AutoTuner(optimizer)`` attaches to a DistributedOptimizer's ``step()``
    (``PUSHPULL_AUTOTUNE=1`` does this for you); without an optimizer, call
    :meth:`step` once per training step on every worker. Arguments left None
    come from the ``PUSHPULL_AUTOTUNE_*`` settings. ``broadcast``, ``apply``,
    ``clock`` and ``rank`` replace the cluster for tests.
    """

    def __init__(self, optimizer: torch.optim.Optimizer | None = None, *, model_elements: int | None = None,
                 itemsize: int | None = None, n_startup: int | None = None, n_trials: int | None = None,
                 window: int | None = None, warmup: int | None = None, sampler: str | None = None,
                 scale: float | None = None, seed: int | None = None, log_path: str | Path | None = None,
                 space: Space | None = None, baseline: tuple[int, int] | None = None,
                 broadcast: Callable[[list[int]], list[int]] | None = None,
                 apply: Callable[[int, int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter, rank: int | None = None):
        from pushpull.torch import ops

        cfg = ops.config() if ops.is_initialized() else None
        if cfg is None and (broadcast is None or rank is None):
            raise RuntimeError("AutoTuner needs pushpull.torch.init() first (or broadcast= and rank= for tests)")
        defaults = cfg if cfg is not None else load_config({})

        def opt(value, name):
            return value if value is not None else getattr(defaults, name)

        self.rank = ops.rank() if rank is None else rank
        self.window = opt(window, "autotune_window")
        self.warmup = opt(warmup, "autotune_warmup")
        if self.window < 1 or self.warmup < 0:
            raise ValueError(f"autotune window must be >= 1 and warmup >= 0, got {self.window}, {self.warmup}")
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad] if optimizer else []
        if model_elements is None:
            if not params:
                raise ValueError("AutoTuner needs an optimizer or model_elements= to size its search space")
            model_elements = sum(p.numel() for p in params)
        if itemsize is None:
            itemsize = params[0].element_size() if params else 4
        if space is None:
            space = Space.for_model(model_elements, itemsize, cfg.backend if cfg else "ps",
                                    scale if scale is not None else (cfg.autotune_scale if cfg else None),
                                    max_partition=max_partition_bytes(cfg) if cfg and cfg.backend == "ps" else None)
        self.space = space
        eng = ops.engine() if cfg is not None else None
        # what is in force now (a strategy may have set it), else the configuration
        self._base_partition = eng.cfg.partition_bytes if eng is not None else (cfg.partition_bytes if cfg else None)
        if baseline is None and eng is not None:
            baseline = (eng.cfg.partition_bytes, eng.kv.queue.credit_bytes)
        elif baseline is None and cfg is not None:
            baseline = (cfg.partition_bytes, (cfg.scheduling_credit or 0) * cfg.partition_bytes)
        baseline = space.clamp(*(baseline or (space.partition[1], space.credit[1])))
        self._broadcast = broadcast or _broadcast_from_root
        self._apply = apply or (lambda p, c: apply_setting(p, c, self._base_partition))
        self._clock = clock
        self.search = None
        if self.rank == 0:
            self.search = Search(space, opt(n_startup, "autotune_startup_trials"), opt(n_trials, "autotune_trials"),
                                 opt(sampler, "autotune_sampler"), opt(seed, "autotune_seed"), baseline)
            first = self.search.ask()
            assert first is not None and (first["partition_bytes"], first["credit_bytes"]) == baseline
        if log_path is None:
            log_path = (cfg.autotune_log if cfg is not None else None) or (
                Path(cfg.trace_dir) / str(self.rank) / "autotune.jsonl" if cfg is not None else None)
        self.log_path = Path(str(log_path).replace("{rank}", str(self.rank))) if log_path else None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text("")
        self.steps = 0               # training steps completed
        self.trial = 0
        self.done = False
        self.setting = baseline
        self.best: dict | None = None
        self.applied: list[dict] = []
        self._durations: list[float] = []
        self._last: float | None = None
        self._log({"event": "space", "partition_bytes": list(space.partition), "credit_bytes": list(space.credit),
                   "model_elements": model_elements, "window": self.window, "warmup": self.warmup})
        self._set(0, baseline, 0)
        if optimizer is not None:
            register = getattr(optimizer, "register_step_callback", None)
            if register is None:
                raise TypeError(f"AutoTuner(optimizer): a {type(optimizer).__name__} has no register_step_callback; "
                                f"pass a pushpull DistributedOptimizer or ScheduledOptimizer, or build the tuner "
                                f"without one and call tuner.step() after every training step")
            register(self.step)

    # ------------------------------------------------------------ per step --
    def step(self) -> None:
        """One training step has finished on this worker."""
        if self.done:
            return
        now = self._clock()
        if self._last is not None:
            self._durations.append(now - self._last)
        self.steps += 1
        if len(self._durations) >= self.warmup + self.window:
            self._decide()
        self._last = self._clock()  # the decision itself is not part of any step

    def _decide(self) -> None:
        measured = self._durations[self.warmup:]
        self._durations = []
        vec = [self.steps, 0, 0, 0, 0]
        if self.search is not None:
            value = sum(measured) / len(measured)
            self.search.tell(value)
            p, c = self.setting
            self._log({"event": "trial", "trial": self.trial, "partition_bytes": p, "credit_bytes": c,
                       "step_time_s": value, "steps": len(measured)})
            log.info("autotune trial %d: partition %d B, credit %d B -> %.2f ms/step", self.trial, p, c, value * 1e3)
            nxt = self.search.ask()
            done = nxt is None
            if done:
                nxt = self.search.best
            vec = [self.steps, nxt["partition_bytes"], nxt["credit_bytes"], self.trial + 1, int(done)]
        got = self._broadcast(vec)
        if got[0] != self.steps:
            raise RuntimeError(f"auto-tuning out of step: rank {self.rank} is at step {self.steps}, rank 0 decided "
                               f"at step {got[0]}; every worker must call the tuner once per training step")
        _, p, c, trial, done = got
        self._set(self.steps, (p, c), trial, final=bool(done))
        if done:
            self.done = True
            if self.search is not None:
                self.best = self.search.best
                self._log({"event": "best", **self.best})
                log.info("autotune chose partition %d B, credit %d B (%.2f ms/step, trial %d)",
                         self.best["partition_bytes"], self.best["credit_bytes"], self.best["value"] * 1e3,
                         self.best["trial"])

    def _set(self, step: int, setting: tuple[int, int], trial: int, final: bool = False) -> None:
        p, c = int(setting[0]), int(setting[1])
        self._apply(p, c)
        self.setting = (p, c)
        self.trial = trial
        rec = {"event": "apply", "rank": self.rank, "step": step, "trial": trial, "partition_bytes": p,
               "credit_bytes": c, "final": final}
        self.applied.append(rec)
        self._log(rec)
        from pushpull.worker import trace

        if trace.current is not None:
            trace.current.mark("step", "autotune" + (" (final)" if final else ""), partition_bytes=p,
                               credit_bytes=c, trial=trial)

    def _log(self, rec: dict) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(json.dumps({"time": round(time.time(), 3), **rec}) + "\n")


def read_log(path: str | Path) -> list[dict]:
    """The records of an auto-tuning JSON-lines log."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


__all__ = ["AutoTuner", "Search", "Space", "apply_setting", "read_log"]
