"""BSP: hold every gradient until the backward pass is over, then reduce them
all as one flat buffer. No overlap with backward, one message: the baseline
that shows what overlap buys. The layout is sorted by name, so it is the same
on every worker whatever order autograd produced the gradients in."""
from __future__ import annotations

import torch

from pushpull.torch.strategies.base import Strategy


class BSP(Strategy):
    name = "bsp"

    def __init__(self, compression=None, **options):
        super().__init__(compression, **options)
        self._held: dict[str, tuple[torch.Tensor, int]] = {}

    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        self._held[name] = (grad, priority)

    def reset(self) -> None:
        super().reset()
        self._held.clear()

    def on_backward_done(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, {}
        members = [(n, held[n][0]) for n in sorted(held)]
        self._launch_packed("bsp", members, max(p for _, p in held.values()))
