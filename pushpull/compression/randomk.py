"""Random-k sparsification: k uniformly drawn entries, rescaled to be unbiased."""

from __future__ import annotations

import numpy as np
import torch

from .base import Compressor, Payload, check_k, flat_input, make_rng, register_codec, resolve_k
from .sparse import scatter_decode, sparse_layout


@register_codec
class RandomK(Compressor):
    """k indices drawn uniformly with replacement, values scaled by n/k.

    E[decode] = sum_j (n/k) * P(draw j hits i) * x_i = x, so the estimate is
    unbiased; repeated draws of one index add up on decode. Workers built
    with the same seed draw the same indices, as in BytePS.
    """

    codec = 4
    name = "randomk"

    def __init__(self, k: float, seed: int | None = None):
        self.k = check_k(k, "randomk")
        self.seed = seed
        self._rng = make_rng(seed)

    def reset(self) -> None:
        self._rng = make_rng(self.seed)

    def compress(self, tensor: torch.Tensor) -> Payload:
        source = flat_input(tensor, compute_dtype=None)
        n = source.numel()
        k = resolve_k(self.k, n)
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, count=k)
        if k == 0:
            return payload
        index_section, value_section = payload.sections
        idx_np = index_section.numpy()
        idx_np[:] = self._rng.integers(0, n, size=k, dtype=idx_np.dtype)
        if source.dtype in (torch.float32, torch.float64):
            values = value_section.numpy()
            np.take(source.numpy(), idx_np, out=values)
            np.multiply(values, n / k, out=values)
        else:  # half types: NumPy has no bf16
            torch.index_select(source, 0, index_section, out=value_section)
            value_section.mul_(n / k)
        return payload

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        return sparse_layout(numel, dtype, param, count, flags)

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        return scatter_decode(payload, out, accumulate=True)

    def __repr__(self) -> str:
        return f"RandomK(k={self.k:g}, seed={self.seed})"
