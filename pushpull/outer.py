"""The outer optimizer of local SGD and DiLoCo (Douillard et al., arXiv 2311.08105), over NumPy arrays.

Why here: the servers hold it (one per key: the global parameters of a partition and their momentum), and a
job of one worker applies the same steps itself (:mod:`pushpull.torch.diloco`), so both read this one file.

A round's input is the sum of the workers' pseudo-gradients (global parameters minus their local ones after
H inner steps) and how many workers pushed; the step is PyTorch's SGD on their mean ``g``:
``buf = momentum * buf + g`` (``buf = g`` at the first step), ``d = g + momentum * buf`` with Nesterov, else
``buf``, and ``params -= lr * d``. Plain local SGD is ``lr=1, momentum=0``: the mean of the local parameters.
The first round is the start: its input is every worker's parameters (equal after the broadcast), and their
mean becomes the global parameters.
"""
from __future__ import annotations

import math

import numpy as np

DEFAULTS = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}  # DiLoCo's published settings


def settings(meta: dict) -> dict:
    """The outer optimizer's settings from a key's declaration, checked (ValueError naming the bad one)."""
    lr, mu, nesterov = meta.get("outer_lr"), meta.get("outer_momentum"), meta.get("nesterov")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"outer_lr must be a finite number > 0, got {lr!r}")
    if not isinstance(mu, (int, float)) or isinstance(mu, bool) or not 0 <= mu < 1:
        raise ValueError(f"outer_momentum must be a number in [0, 1), got {mu!r}")
    if not isinstance(nesterov, bool):
        raise ValueError(f"nesterov must be true or false, got {nesterov!r}")
    if nesterov and mu == 0:
        raise ValueError("nesterov needs outer_momentum > 0 (as torch.optim.SGD)")
    return {"outer_lr": float(lr), "outer_momentum": float(mu), "nesterov": nesterov}


def round_deadline(meta: dict):
    """DiLoCo's round_deadline from a key's declaration: None (wait for every worker), "auto", or seconds > 0
    (ValueError naming a bad one)."""
    d = meta.get("round_deadline")
    if d is None or d == "auto":
        return d
    if not isinstance(d, (int, float)) or isinstance(d, bool) or not math.isfinite(d) or d <= 0:
        raise ValueError(f"round_deadline must be None, 'auto' or a number of seconds > 0, got {d!r}")
    return float(d)


class OuterSGD:
    """The global parameters of one key and their momentum, in ``dtype`` (the key's accumulation dtype)."""

    def __init__(self, outer_lr: float, outer_momentum: float, nesterov: bool, dtype=np.float32):
        self.lr, self.momentum, self.nesterov = float(outer_lr), float(outer_momentum), bool(nesterov)
        self.dtype = np.dtype(dtype)
        self.params: np.ndarray | None = None
        self.buf: np.ndarray | None = None
        self.rounds = 0

    def apply(self, total: np.ndarray, count: int) -> np.ndarray:
        """One round: ``total`` the sum of ``count`` workers' pushes. Returns the global parameters after it
        (the array itself: copy it before the next round if it must outlive it)."""
        if count < 1:
            raise ValueError("an outer round needs at least one worker's push")
        mean = np.asarray(total, dtype=self.dtype) / self.dtype.type(count)
        self.rounds += 1
        if self.params is None:  # the start: the workers' parameters
            self.params = mean
            return self.params
        g = mean
        if self.momentum:
            if self.buf is None:
                self.buf = g.copy()
            else:
                self.buf *= self.dtype.type(self.momentum)
                self.buf += g
            d = g + self.dtype.type(self.momentum) * self.buf if self.nesterov else self.buf
        else:
            d = g
        self.params -= self.dtype.type(self.lr) * d
        return self.params


def fragments(sizes: list[int], count: int) -> list[list[int]]:
    """Streaming DiLoCo's fragments: ``count`` contiguous groups of parameter indices of about equal total
    size, none empty (the runtime's, pushpull.torch.diloco, and the simulator's, pushpull.sim.diloco)."""
    total, out, cur, acc = sum(sizes), [], [], 0
    for i, n in enumerate(sizes):
        cur.append(i)
        acc += n
        left_groups, left_params = count - len(out) - 1, len(sizes) - i - 1
        if left_groups and (acc >= total * (len(out) + 1) / count or left_params == left_groups):
            out.append(cur)
            cur = []
    out.append(cur)
    return out


def momentum_after(d, buf, momentum: float, nesterov: bool):
    """The momentum buffer after an :class:`OuterSGD` step whose update was ``d`` (``(before - after) / lr``),
    from the one before it (``buf``; None: no step yet): what a worker, which sees only the global parameters
    each round, infers of the servers' state. With Nesterov ``d = g + mu * buf'`` and ``buf' = mu * buf + g``,
    so ``g = (d - mu^2 buf) / (1 + mu)``; without, ``buf' = d``. Arrays of NumPy or torch alike. Its error is
    the parameters' rounding over ``lr * d``, and the recurrence damps an error by ``mu / (1 + mu)`` per step."""
    if not momentum:
        return None
    if not nesterov:
        return d
    if buf is None:
        return d / (1 + momentum)
    return momentum * buf + (d - momentum * momentum * buf) / (1 + momentum)

