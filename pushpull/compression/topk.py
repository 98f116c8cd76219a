"""Top-k sparsification: keep the k entries of largest magnitude."""

from __future__ import annotations

import logging

import numpy as np
import torch

from .base import CHUNK, Codec, Option, Payload, check_k, flat_input, register_codec, require_k, resolve_k
from .sparse import scatter_decode, sparse_layout

log = logging.getLogger(__name__)

# Below this many elements, or when k is a large share of them, an exact
# selection over everything is as cheap as the sampled-threshold pass.
_EXACT_BELOW = 1 << 16
_SAMPLE_MIN = 1 << 16


def _exact_topk(mags: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the k largest magnitudes (ties broken by position)."""
    n = mags.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    kth = np.partition(mags, n - k)[n - k]
    return _select(mags, kth, k)


def _select(mags: np.ndarray, kth, k: int) -> np.ndarray:
    """Ascending positions with mags > kth, plus the first ties at kth to make exactly k."""
    keep = mags > kth
    need = k - int(np.count_nonzero(keep))
    if need > 0:
        keep[np.flatnonzero(mags == kth)[:need]] = True
    return np.flatnonzero(keep)


@register_codec
class TopK(Codec):
    """(index, value) pairs of the k largest |x|; decode scatters them into zeros.

    Exact, but not a full sort: a strided sample estimates a threshold a little
    below the k-th magnitude, one chunked pass collects the (slightly more than
    k) candidates above it, and an O(k) partition picks exactly k of those.
    Indices come out ascending, which keeps the scatter on decode cache-friendly.
    """

    codec = 3
    name = "topk"
    options = {"k": Option(None, None, "elements kept: a count >= 1 or a fraction in (0, 1); required")}

    @classmethod
    def normalize(cls, spec: dict) -> None:
        require_k(spec, cls.name)

    def __init__(self, k: float):
        self.k = check_k(k, "topk")
        self._mags = np.empty(CHUNK, dtype=np.float32)
        self._mask = np.empty(CHUNK, dtype=bool)

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = flat_input(tensor, torch.float64 if tensor.dtype == torch.float64 else torch.float32)
        n = x.numel()
        k = resolve_k(self.k, n)
        xs = x.numpy()
        idx = self._indices(xs, k)
        if idx.size != k:  # NaN compares false with everything: a diverged input. Keep the NaNs
            mags = np.abs(xs)  # (they rank above every number) so the divergence shows downstream.
            mags[np.isnan(mags)] = np.inf
            idx = _exact_topk(mags, k)
        payload = Payload.allocate(self.codec, tensor.dtype, tensor.shape, count=k)
        index_section, value_section = payload.sections
        index_section.numpy()[:] = idx
        if x.dtype == tensor.dtype:
            np.take(xs, idx, out=value_section.numpy())
        else:  # half types: gather the original values, not the fp32 copies
            source = tensor.detach().reshape(-1).cpu()
            torch.index_select(source, 0, torch.from_numpy(idx), out=value_section)
        return payload

    def _indices(self, xs: np.ndarray, k: int) -> np.ndarray:
        n = xs.size
        if k == 0:
            return np.empty(0, dtype=np.int64)
        if n <= _EXACT_BELOW or 4 * k >= n:
            return _exact_topk(np.abs(xs), k)
        # Sample big enough that the threshold's rank in it is ~256 or more.
        sample_size = max(_SAMPLE_MIN, 256 * (n // k))
        if 2 * sample_size >= n:
            return _exact_topk(np.abs(xs), k)
        stride = n // sample_size
        sample = np.abs(xs[::stride])
        expected_rank = k * sample.size / n
        # Aim ~10 % plus three standard deviations above k so the candidate
        # set almost never falls short (and falling short is still correct).
        rank = min(sample.size, int(expected_rank * 1.1 + 3 * expected_rank**0.5 + 8))
        threshold = np.partition(sample, sample.size - rank)[sample.size - rank]
        candidates = self._above(xs, threshold)
        if candidates.size < k:
            log.debug("topk: sampled threshold kept %d < k=%d candidates; exact fallback", candidates.size, k)
            return _exact_topk(np.abs(xs), k)
        mags = np.abs(xs[candidates])
        kth = np.partition(mags, mags.size - k)[mags.size - k]
        return candidates[_select(mags, kth, k)]

    def _above(self, xs: np.ndarray, threshold) -> np.ndarray:
        """Ascending positions with |x| >= threshold, one cache-sized chunk at a time."""
        if xs.dtype != self._mags.dtype:
            return np.flatnonzero(np.abs(xs) >= threshold)
        parts = []
        for start in range(0, xs.size, CHUNK):
            chunk = xs[start:start + CHUNK]
            mags, mask = self._mags[: chunk.size], self._mask[: chunk.size]
            np.abs(chunk, out=mags)
            np.greater_equal(mags, threshold, out=mask)
            hits = np.flatnonzero(mask)
            if hits.size:
                parts.append(hits + start)
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    @staticmethod
    def layout(numel, dtype, param, count, flags):
        return sparse_layout(numel, dtype, param, count, flags)

    @classmethod
    def decode(cls, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        return scatter_decode(payload, out, accumulate=False)

    def __repr__(self) -> str:
        return f"TopK(k={self.k:g})"
