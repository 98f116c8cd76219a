"""A model that replays a profile's compute with sleeps and produces gradients
of the profile's tensor sizes, so DistributedOptimizer and every strategy run
unchanged with real communication, while compute does not compete with the
communication threads for this machine's few cores.

Each profile layer becomes a module owning parameters of the layer's tensor
sizes (times ``size_scale``). Its forward sleeps ``fwd_s * compute_scale``;
an autograd Function's backward sleeps ``bwd_s * compute_scale`` and returns
gradients for its parameters, so autograd's accumulate-grad hooks fire layer
by layer from the output to the input exactly as in a real backward pass.

Sleeps run to absolute deadlines counted from the start of the forward (and
of the backward) pass, so the per-call overhead of sleeping and the time the
hooks spend submitting gradients do not add up over a hundred layers.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from pushpull.profiles import Profile


class _Clock:
    """Deadline-based sleeping for one pass."""

    def __init__(self) -> None:
        self.deadline: float | None = None

    def start(self) -> None:
        self.deadline = time.perf_counter()

    def spend(self, seconds: float) -> None:
        if self.deadline is None:
            self.start()
        self.deadline += seconds  # type: ignore[operator]
        left = self.deadline - time.perf_counter()  # type: ignore[operator]
        if left > 0:
            time.sleep(left)


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layer, *params):
        ctx.layer = layer
        return x.clone()

    @staticmethod
    def backward(ctx, gx):
        layer: EmulatedLayer = ctx.layer
        layer.clock_bwd.spend(layer.bwd_s)
        grads = [torch.full_like(p, 1e-3) for p in layer.params]
        return (gx, None, *grads)


class EmulatedLayer(nn.Module):
    def __init__(self, name: str, fwd_s: float, bwd_s: float, numels: list[int], clock_fwd: _Clock,
                 clock_bwd: _Clock):
        super().__init__()
        self.layer_name = name
        self.fwd_s, self.bwd_s = fwd_s, bwd_s
        # direct parameters (not a ParameterList): forward pre-hooks of this module see them
        for i, n in enumerate(numels):
            self.register_parameter(f"p{i}", nn.Parameter(torch.zeros(n)))
        self.params = [getattr(self, f"p{i}") for i in range(len(numels))]
        self.clock_fwd, self.clock_bwd = clock_fwd, clock_bwd

    def forward(self, x):
        self.clock_fwd.spend(self.fwd_s)
        return _Replay.apply(x, self, *self.params)


class EmulatedModel(nn.Module):
    """``model(x).sum().backward()`` replays one training step's compute."""

    def __init__(self, profile: Profile, compute_scale: float = 1.0, size_scale: float = 1.0):
        super().__init__()
        if compute_scale < 0 or size_scale <= 0:
            raise ValueError(f"compute_scale must be >= 0 and size_scale > 0, got {compute_scale}, {size_scale}")
        self.profile = profile
        self.compute_scale, self.size_scale = compute_scale, size_scale
        self._fwd, self._bwd = _Clock(), _Clock()
        self.layers = nn.ModuleList(
            EmulatedLayer(l.name, l.fwd_s * compute_scale, l.bwd_s * compute_scale,
                          [max(1, int(round(t.numel * size_scale))) for t in l.tensors], self._fwd, self._bwd)
            for l in profile.layers)

    def forward(self, x):
        self._fwd.start()
        self._bwd.deadline = None  # the first layer's backward starts the backward clock
        x = x.requires_grad_() if not x.requires_grad else x
        for layer in self.layers:
            x = layer(x)
        return x

    @property
    def compute_s(self) -> float:
        return self.profile.compute_s * self.compute_scale

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())
