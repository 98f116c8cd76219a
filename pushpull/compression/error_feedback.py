"""Vanilla error feedback: what compression dropped is sent on later steps."""

from __future__ import annotations

from typing import Callable

import torch

from .base import Codec, Payload
from .wrapper import Wrapper


class ErrorFeedback(Wrapper):
    """p = g + (lr_prev / lr) * e;  c = C(p);  e = p - D(c).

    The residual e is kept in gradient units, so when the learning rate
    changes it is rescaled by lr_prev / lr: the pending update lr_prev * e is
    then applied at the same size under the new rate. ``lr_getter`` returns
    the current rate (e.g. ``lambda: opt.param_groups[0]["lr"]``); without
    one the ratio is 1.
    """

    key, value, order, on_server = "ef", "vanilla", 10, True
    own_state = ("error", "lr_prev")

    def __init__(self, compressor: Codec, lr_getter: Callable[[], float] | None = None):
        super().__init__(compressor)
        self.lr_getter = lr_getter
        self._error: torch.Tensor | None = None
        self._decoded: torch.Tensor | None = None
        self._lr_prev: float | None = None

    @classmethod
    def wrap(cls, inner, spec, lr_getter):
        return cls(inner, lr_getter=lr_getter)

    @property
    def error(self) -> torch.Tensor | None:
        """The current residual (None before the first compress)."""
        return self._error

    def forget(self) -> None:
        self._error = self._decoded = None
        self._lr_prev = None

    def _loaded(self) -> None:
        if self._lr_prev is not None:
            self._lr_prev = float(self._lr_prev)
        if self._error is not None:
            self._decoded = torch.empty_like(self._error)

    def _lr_ratio(self) -> float:
        if self.lr_getter is None:
            return 1.0
        lr = float(self.lr_getter())
        ratio = self._lr_prev / lr if self._lr_prev is not None and lr != 0.0 and self._lr_prev != 0.0 else 1.0
        self._lr_prev = lr
        return ratio

    def compress(self, tensor: torch.Tensor) -> Payload:
        grad = tensor.detach()
        error = self._error
        if error is None or error.shape != grad.shape or error.dtype != grad.dtype:
            error = self._error = torch.zeros(grad.shape, dtype=grad.dtype)
            self._decoded = torch.empty_like(error)
        ratio = self._lr_ratio()
        if ratio != 1.0:
            error.mul_(ratio)
        error.add_(grad.cpu())  # the error buffer now holds p
        payload = self.inner.compress(error)
        self.inner.decompress(payload, out=self._decoded)
        error.sub_(self._decoded)
        return payload
