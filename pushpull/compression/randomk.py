"""Random-k sparsification: k uniformly drawn entries (BytePS semantics).

Two modes, chosen as BytePS chooses them: without error feedback the kept
values are scaled by n/k so the estimate is unbiased; with error feedback they
are sent as they are, because EF needs a contraction (what is sent must never
exceed what there was to send) and the n/k-scaled estimate is not one.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import SEED, Codec, Option, Payload, check_k, flat_input, make_rng, register_codec, require_k, resolve_k
from .sparse import scatter_decode, sparse_layout

# Header flag bit 0: the values were multiplied by n/k (informational; decode is the same).
SCALED = 1
# BytePS seeds random-k with 2020 when no seed is given: the same on every worker.
DEFAULT_SEED = 2020


@register_codec
class RandomK(Codec):
    """k indices drawn uniformly with replacement; repeated indices add on decode.

    ``scale=True``: every draw carries x_i * n/k, so E[decode] = x exactly.
    ``scale=False`` (for error feedback): each distinct drawn index carries x_i
    once (its repeats carry 0), so decode = x on the drawn set and 0 elsewhere
    and the EF residual x - decode never exceeds x. Workers built with the same
    seed draw the same indices, as in BytePS.
    """

    codec = 4
    name = "randomk"
    options = {"k": Option(None, None, "elements drawn: a count >= 1 or a fraction in (0, 1); required"),
               "seed": SEED}

    @classmethod
    def normalize(cls, spec: dict) -> None:
        require_k(spec, cls.name)

    @classmethod
    def from_spec(cls, spec: dict, seed_offset: int = 0) -> "RandomK":
        # BytePS: all workers share one default seed (so they pick the same indices and the server's sum
        # stays k-sparse), and the n/k scaling is on only without error feedback.
        seed = DEFAULT_SEED if spec["seed"] is None else spec["seed"]
        return cls(spec["k"], seed=seed + seed_offset, scale=spec["ef"] == "none")

    @classmethod
    def server_chain(cls, spec, seed_offset, wrap):
        # BytePS' server neither re-samples nor re-scales random-k: it sums the pushes on their shared
        # support and sends that back. Re-sampling would drop most of the sum (and, scaled, multiply it by
        # n/k a second time). Nothing is dropped, so no error feedback either.
        return RandomKSum()

    def __init__(self, k: float, seed: int | None = None, scale: bool = True):
        self.k = check_k(k, "randomk")
        self.seed = seed
        self.scale = bool(scale)
        self._rng = make_rng(seed)

    def reset(self) -> None:
        self._rng = make_rng(self.seed)

    def compress(self, tensor: torch.Tensor) -> Payload:
        source = flat_input(tensor, compute_dtype=None)
        n = source.numel()
        k = resolve_k(self.k, n)
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, count=k,
                                   flags=SCALED if self.scale else 0)
        if k == 0:
            return payload
        index_section, value_section = payload.sections
        idx_np = index_section.numpy()
        idx_np[:] = self._rng.integers(0, n, size=k, dtype=idx_np.dtype)
        if not self.scale:
            idx_np.sort()  # repeats become neighbours (and the decode scatter runs in order)
        if source.dtype in (torch.float32, torch.float64):
            values = value_section.numpy()
            np.take(source.numpy(), idx_np, out=values)
        else:  # half types: NumPy has no bf16
            torch.index_select(source, 0, index_section, out=value_section)
            values = value_section
        if self.scale:
            values *= n / k
        else:
            repeat = torch.from_numpy(idx_np[1:] == idx_np[:-1])
            value_section[1:].masked_fill_(repeat, 0)
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        return sparse_layout(numel, dtype, param, count, flags)

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        return scatter_decode(payload, out, accumulate=True)

    def __repr__(self) -> str:
        return f"RandomK(k={self.k:g}, seed={self.seed}, scale={self.scale})"


class RandomKSum(Codec):
    """The server's random-k: send the sum of the pushes on their own support.

    BytePS' server does not re-sample random-k: with one seed on every worker
    all pushes share one index set, their sum lives on it, and the server sums
    the values and returns them. Here the server has decoded the pushes into a
    dense sum, so it sends every non-zero entry of it as a random-k payload:
    at most k pairs with a shared seed, exact (nothing is dropped, so there is
    nothing for error feedback to carry). Workers with different seeds still
    get the exact sum, at up to (workers x k) pairs.
    """

    codec = RandomK.codec  # decoded by RandomK.decode (not registered a second time)
    name = "randomk"

    def compress(self, tensor: torch.Tensor) -> Payload:
        source = flat_input(tensor, compute_dtype=None)
        keep = torch.from_numpy(np.flatnonzero(source.numpy())) if source.dtype in (torch.float32, torch.float64) \
            else torch.nonzero(source).view(-1)
        payload = Payload.allocate(RandomK.codec, tensor.dtype, tensor.shape, count=keep.numel())
        if keep.numel():
            index_section, value_section = payload.sections
            index_section.copy_(keep)
            torch.index_select(source, 0, keep, out=value_section)
        return payload
