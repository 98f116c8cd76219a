"""Stand-ins shared by the strategy tests (no processes): a backend whose reduction of n identical
workers is known exactly."""
from __future__ import annotations

from pushpull.torch.executors.comm import Comm


class Doubling(Comm):
    """A backend whose 'average' doubles the tensor (and whose broadcast, a sum of one rank's values,
    leaves it alone), recording the name of every reduction it was given."""

    def __init__(self, backend: str = "ps"):
        self.backend = backend
        self.sent: list[str] = []

    def submit(self, tensor, name, priority, average=True):
        self.sent.append(name)
        if average:
            tensor.mul_(2)
        return name

    def wait(self, token):
        pass

    def poll(self, token):
        return True


def drive(strategy, steps: int, mixed_dtypes: bool = True) -> None:
    """Run ``steps`` steps of five gradients (g0 nearest the input, submitted output first) through
    ``strategy`` over a :class:`Doubling` backend and check each comes back doubled, in place.
    ``mixed_dtypes``: g2 is float64 (fused buffers hold one dtype)."""
    import torch

    for step in range(steps):
        grads = {i: torch.full((10 * (i + 1),), float(i + step),
                               dtype=torch.float64 if mixed_dtypes and i == 2 else torch.float32)
                 for i in range(5)}
        for i in reversed(range(5)):
            strategy.on_ready(f"g{i}", grads[i], -i)
        strategy.on_backward_done()
        strategy.wait_all()
        for i in range(5):
            assert torch.equal(grads[i], torch.full_like(grads[i], 2.0 * (i + step))), (step, i)
