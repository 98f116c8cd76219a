"""Nesterov momentum applied before compression (momentum -> EF -> compressor)."""

from __future__ import annotations

import torch

from .base import Codec, Option, Payload
from .wrapper import Wrapper


def _check_mu(mu) -> None:
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0.0 <= mu < 1.0:
        raise ValueError(f"compression spec: mu must be a number in [0, 1), got {mu!r}")


class NesterovMomentum(Wrapper):
    """m = mu * m + g;  g' = g + mu * m;  then compress g'.

    Momentum is folded in on the worker, before compression, so the
    optimizer itself should run without momentum. For that reason it applies to every floating tensor,
    also those too small to be compressed (they go through the identity codec): ``every_tensor``.
    """

    key, value, order, on_server, every_tensor = "momentum", "nesterov", 20, False, True
    options = {"mu": Option(0.9, _check_mu, "Nesterov momentum coefficient, in [0, 1)")}
    own_state = ("momentum",)

    def __init__(self, compressor: Codec, mu: float = 0.9):
        mu = float(mu)
        if not 0.0 <= mu < 1.0:
            raise ValueError(f"nesterov momentum: mu must be in [0, 1), got {mu!r}")
        super().__init__(compressor)
        self.mu = mu
        self._momentum: torch.Tensor | None = None
        self._lookahead: torch.Tensor | None = None

    @classmethod
    def wrap(cls, inner, spec, lr_getter):
        return cls(inner, mu=spec["mu"])

    @property
    def momentum(self) -> torch.Tensor | None:
        return self._momentum

    def forget(self) -> None:
        self._momentum = self._lookahead = None

    def _loaded(self) -> None:
        if self._momentum is not None:
            self._lookahead = torch.empty_like(self._momentum)

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

    def __repr__(self) -> str:
        return f"NesterovMomentum({self.inner!r}, mu={self.mu})"
