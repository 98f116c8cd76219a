"""MG-WFBP (Shi et al., "MG-WFBP: Efficient Data Communication for Distributed Synchronous SGD
Algorithms", INFOCOM 2019): merge gradients of neighbouring layers when that finishes the communication
sooner than sending them one by one.

With a linear cost ``t(bytes) = alpha + beta*bytes`` and the backward-time profile, merging layer l-1 into
the message that holds layer l saves one ``alpha`` and costs the time the message waits for l-1's
gradient; walking from the output to the input and merging whenever the wait is shorter than ``alpha``
(or there is no wait because the network is still busy) is the greedy rule of the paper. Tiny layers are
always merged: their message would be all ``alpha``.

The runtime feeds it the measured ready times and an alpha-beta model fitted on the live backend
(:func:`fit_alpha_beta`); the simulator feeds it the profile's layers and the cluster's model.
"""
from __future__ import annotations

from pushpull.policy.base import OWN, Policy

SMALL_ELEMENTS = 8192


def mgwfbp_merge(bwd_times: list[float], sizes_bytes: list[float], alpha: float, beta: float,
                 small_bytes: float = SMALL_ELEMENTS * 4) -> list[list[int]]:
    """Group layers for MG-WFBP.

    ``bwd_times`` and ``sizes_bytes`` are per layer in *forward* order (index 0
    is the input layer). Returns the groups in communication order (the
    output-side group first), each group listing its layers output-first,
    e.g. ``[[3, 2], [1], [0]]``.

    Walk l = L-1 .. 1 with a current group G ending at layer l:
      * G would start at ``start = max(ready(l), end of the previous group)``
        and finish at ``start + alpha + beta*bytes(G)``;
      * merge l-1 into G when l-1 is ready before G would finish and
        either G would wait for the network anyway (ready(l-1) <= start) or
        the extra wait ``ready(l-1) - start`` is smaller than ``alpha``;
      * always merge when l-1 or G is smaller than ``small_bytes``.
    """
    L = len(bwd_times)
    if L != len(sizes_bytes):
        raise ValueError(f"sizes_bytes: expected {L} entries (one per layer), got {len(sizes_bytes)}")
    if L == 0:
        return []
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha!r}, beta={beta!r}")
    # ready[l]: when layer l's gradient is ready, counted from the start of the backward
    ready = [0.0] * L
    acc = 0.0
    for l in range(L - 1, -1, -1):
        acc += bwd_times[l]
        ready[l] = acc

    groups: list[list[int]] = []
    cur, cur_bytes, prev_end = [L - 1], float(sizes_bytes[L - 1]), 0.0
    for l in range(L - 1, 0, -1):
        c = l - 1
        start = max(ready[cur[-1]], prev_end)
        finish = start + alpha + beta * cur_bytes
        wait = ready[c] - start
        small = sizes_bytes[c] < small_bytes or cur_bytes < small_bytes
        ready_in_time = ready[c] < finish
        if small or (ready_in_time and (wait <= 0 or wait < alpha)):
            cur.append(c)
            cur_bytes += sizes_bytes[c]
        else:
            groups.append(cur)
            prev_end = finish
            cur, cur_bytes = [c], float(sizes_bytes[c])
    groups.append(cur)
    return groups


def mgwfbp_groups(ready_s: list[float], sizes: list[int], alpha: float, beta: float,
                  small_bytes: int = SMALL_ELEMENTS * 4) -> list[list[int]]:
    """MG-WFBP buffers for tensors given in ready order (output side first).

    Adapts the ready-time view to :func:`mgwfbp_merge`'s per-layer backward
    times in forward order: tensor ``i`` of ``L`` is layer ``L-1-i`` and its
    backward time is the gap since the previous tensor became ready.
    Returns groups of ready-order indices in launch order.
    """
    L = len(ready_s)
    if L != len(sizes):
        raise ValueError(f"mgwfbp_groups: {L} ready times but {len(sizes)} sizes")
    bwd = [0.0] * L
    for i in range(L):
        bwd[L - 1 - i] = max(0.0, ready_s[i] - (ready_s[i - 1] if i else ready_s[0]))
    fwd_sizes = [float(sizes[L - 1 - f]) for f in range(L)]
    groups = mgwfbp_merge(bwd, fwd_sizes, alpha, beta, small_bytes=small_bytes)
    return [[L - 1 - f for f in g] for g in groups]


def fit_alpha_beta(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line t = alpha + beta * bytes through (bytes, seconds), clamped to >= 0."""
    n = len(samples)
    if n < 2:
        raise ValueError("fit_alpha_beta needs at least two samples")
    mx = sum(b for b, _ in samples) / n
    my = sum(t for _, t in samples) / n
    sxx = sum((b - mx) ** 2 for b, _ in samples)
    beta = sum((b - mx) * (t - my) for b, t in samples) / sxx if sxx > 0 else 0.0
    beta = max(beta, 0.0)
    alpha = max(my - beta * mx, 0.0)
    return alpha, beta


class MGWFBP(Policy):
    """merge neighbouring gradients when that finishes sooner (alpha-beta model, Shi et al.)"""
    name = "mgwfbp"
    aliases = ("mg-wfbp",)
    order = 40
    release = "plan"
    options = {"alpha": None, "beta": None}
    runtime = OWN           # fits alpha and beta on the live backend
    simulator = OWN         # merges the profile's layers

    @classmethod
    def plan(cls, ready_s, sizes, alpha: float = 0.0, beta: float = 0.0, **_):
        return mgwfbp_groups(ready_s, sizes, alpha, beta)
