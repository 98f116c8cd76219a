"""MG-WFBP (Shi et al.): merge consecutive gradients when that finishes the
communication sooner than sending them one by one. The decision is the
pure function :func:`pushpull.policy.mgwfbp.mgwfbp_merge`, which the simulator runs too
(the rule of Shi et al., MG-WFBP, INFOCOM 2019: walk from output to input, merge when the next gradient is
ready before the current message would finish and the extra wait is under
alpha or the network is busy anyway; tensors under 8192 elements always
merge), fed with:

* the backward-time profile: gradient-ready times measured during the
  warm-up steps, rank 0's copy agreed by all (:mod:`.planned`);
* the alpha-beta model of this backend: options ``alpha`` (s) and ``beta``
  (s/byte), else PUSHPULL_MGWFBP_ALPHA/BETA, else fitted by least squares to
  a few timed reductions of 4 KiB to 2 MiB at the end of the warm-up.
"""
from __future__ import annotations

import statistics
import time

import torch

from pushpull.policy import register_executor
from pushpull.policy.mgwfbp import fit_alpha_beta, mgwfbp_groups
from pushpull.torch import ops
from pushpull.torch.executors.planned import PlannedStrategy

PROBE_BYTES = (4096, 65536, 524288, 2097152)


__all__ = ["MGWFBP"]


@register_executor("mgwfbp", "runtime")
class MGWFBP(PlannedStrategy):
    name = "mgwfbp"

    def __init__(self, compression=None, alpha: float | None = None, beta: float | None = None, **options):
        cfg = ops.config()
        self.alpha = alpha if alpha is not None else cfg.mgwfbp_alpha
        self.beta = beta if beta is not None else cfg.mgwfbp_beta
        super().__init__(compression, **options)

    def measure_alpha_beta(self, reps: int = 3) -> tuple[float, float]:
        """Time a few reductions of different sizes (a collective: every worker runs it)."""
        samples = []
        for nbytes in PROBE_BYTES:
            t = torch.zeros(nbytes // 4, dtype=torch.float32)
            name = f"mgwfbp.probe.{nbytes}"
            self.comm.wait(self.comm.submit(t, name, 0))  # first use sets up keys: not timed
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                self.comm.wait(self.comm.submit(t, name, 0))
                times.append(time.perf_counter() - t0)
            samples.append((nbytes, statistics.median(times)))
        return fit_alpha_beta(samples)

    def agreed_extra(self) -> list[float]:
        if self.alpha is None or self.beta is None:
            a, b = self.measure_alpha_beta()
            return [a if self.alpha is None else self.alpha, b if self.beta is None else self.beta]
        return [self.alpha, self.beta]

    def use_extra(self, values: list[float]) -> None:
        self.alpha, self.beta = values

    def make_plan(self, names, ready_s, sizes):
        return mgwfbp_groups(ready_s, sizes, self.alpha, self.beta)
