"""Nesterov momentum applied before compression (momentum -> EF -> compressor)."""

from __future__ import annotations

import torch

from .base import Compressor, Payload


class NesterovMomentum(Compressor):
    """m = mu * m + g;  g' = g + mu * m;  then compress g'.

    Momentum is folded in on the worker, before compression, so the
    optimizer itself should run without momentum.
    """

    def __init__(self, compressor: Compressor, mu: float = 0.9):
        mu = float(mu)
        if not 0.0 <= mu < 1.0:
            raise ValueError(f"nesterov momentum: mu must be in [0, 1), got {mu!r}")
        self.inner = compressor
        self.mu = mu
        self._momentum: torch.Tensor | None = None
        self._lookahead: torch.Tensor | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def momentum(self) -> torch.Tensor | None:
        return self._momentum

    def reset(self) -> None:
        self._momentum = self._lookahead = None
        self.inner.reset()

    def compress(self, tensor: torch.Tensor) -> Payload:
        grad = tensor.detach().cpu()
        m = self._momentum
        if m is None or m.shape != grad.shape or m.dtype != grad.dtype:
            m = self._momentum = torch.zeros(grad.shape, dtype=grad.dtype)
            self._lookahead = torch.empty_like(m)
        m.mul_(self.mu).add_(grad)
        # Reused buffer: every codec copies its input into a fresh payload.
        torch.add(grad, m, alpha=self.mu, out=self._lookahead)
        return self.inner.compress(self._lookahead)

    def decompress(self, payload, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner.decompress(payload, out)

    def __repr__(self) -> str:
        return f"NesterovMomentum({self.inner!r}, mu={self.mu})"
