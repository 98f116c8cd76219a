"""What error feedback and momentum have in common: a stateful stage around a codec (GRACE's "memory").

A wrapper is switched on by one key of the spec (``ef: vanilla``, ``momentum: nesterov``), may read
options of its own (``mu``), keeps per-tensor state, and decodes through the codec it wraps. The
registry applies the wrappers innermost first by ``order`` (worker: momentum -> error feedback -> codec)
and on the servers only those with ``on_server``.
"""
from __future__ import annotations

from typing import Callable, ClassVar

import torch

from .base import Codec, Option


class Wrapper(Codec):
    key: ClassVar[str] = ""             # the spec key that switches it on
    value: ClassVar[str] = ""           # ... and the value that does
    order: ClassVar[int] = 0            # smaller = nearer the codec
    on_server: ClassVar[bool] = False   # servers re-compress sums under it too
    every_tensor: ClassVar[bool] = False  # also for tensors too small to compress (sent raw): momentum
    options: ClassVar[dict[str, Option]] = {}

    def __init__(self, inner: Codec):
        self.inner = inner

    @classmethod
    def wrap(cls, inner: Codec, spec: dict, lr_getter: Callable[[], float] | None) -> "Wrapper":
        """This wrapper around ``inner`` with the spec's options."""
        raise NotImplementedError

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def forget(self) -> None:
        """Drop this wrapper's own per-tensor state."""

    def reset(self) -> None:
        self.forget()
        self.inner.reset()

    # this wrapper's own state's names (the codec it wraps has its own, under "inner.")
    own_state: ClassVar[tuple[str, ...]] = ()

    def state_dict(self) -> dict:
        inner = {f"inner.{k}": v for k, v in self.inner.state_dict().items()}
        return {**inner, **{k: getattr(self, f"_{k}") for k in self.own_state}}

    def load_state_dict(self, state: dict) -> None:
        own = {k: v for k, v in state.items() if not k.startswith("inner.")}
        unknown = sorted(set(own) - set(self.own_state))
        if unknown:
            raise ValueError(f"{type(self).__name__}: no state named {unknown}")
        self.inner.load_state_dict({k[len("inner."):]: v for k, v in state.items() if k.startswith("inner.")})
        self.forget()
        for k in self.own_state:
            v = own.get(k)
            setattr(self, f"_{k}", v.detach().clone() if isinstance(v, torch.Tensor) else v)
        self._loaded()

    def _loaded(self) -> None:
        """After :meth:`load_state_dict`: rebuild what is derived from the state (scratch buffers)."""

    def decompress(self, payload, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner.decompress(payload, out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
