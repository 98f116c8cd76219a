"""The strategy interface, in the spirit of PyTorch's DDP comm hooks: small
objects that receive ready gradients and hand back reduced ones."""
from __future__ import annotations

import torch


class Strategy:
    """Receives gradients as autograd produces them and reduces them in place.

    ``on_ready`` is called from the autograd thread as soon as a gradient is
    final for this step; ``wait_all`` blocks until every gradient submitted
    since the last call is averaged over all workers, written back into the
    same tensor. ``priority``: larger is more urgent (the layer nearest the
    input has the largest). ``compression`` is a compression spec or None.
    """

    name = "base"

    def __init__(self, compression=None, **options):
        self.compression = compression
        self.options = options

    def on_ready(self, name: str, grad: torch.Tensor, priority: int) -> None:
        raise NotImplementedError

    def on_backward_done(self) -> None:
        """All gradients of this step have been submitted (called before ``wait_all``)."""

    def wait_all(self) -> None:
        raise NotImplementedError

    def pending(self) -> int:
        """How many submitted gradients are not reduced yet."""
        return 0
