"""WFBP (wait-free backpropagation): each gradient is reduced on its own as soon
as it is ready, overlapping communication with the rest of the backward pass.
The backend keeps its default partitioning and credit (over the parameter
servers: BYTEPS_SCHEDULING_CREDIT, 0 = off, i.e. first come first served)."""
from __future__ import annotations

import torch

from pushpull.torch.strategies.base import Strategy


class WFBP(Strategy):
    name = "wfbp"

    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        self._launch(name, [(name, grad)], priority)
