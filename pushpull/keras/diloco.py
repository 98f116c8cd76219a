"""Local SGD and DiLoCo for TensorFlow and Keras 3 (``pushpull.keras.DiLoCo``, ``pushpull.tensorflow.DiLoCo``).

The same rounds as :class:`pushpull.torch.DiLoCo` (see it for why): each worker takes ``sync_every`` (H) steps of
its own optimizer alone, then pushes its pseudo-gradient (the global parameters minus its own) and the servers
average them and take one outer step (:mod:`pushpull.outer`: SGD, Nesterov momentum 0.9, lr 0.7 by default) on
the global parameters they hold; every worker takes the result. The variables cross as NumPy arrays through the
framework-neutral job context, so no torch is needed; ``tf.Variable`` and Keras variables on the tensorflow and
torch backends work alike (not on JAX, where ``fit`` keeps the weights outside the variables).

    model.compile(optimizer=keras.optimizers.AdamW(4e-4), loss=...)       # the inner optimizer, not wrapped
    model.fit(x, y, callbacks=[pushpull.keras.callbacks.DiLoCoCallback(sync_every=100)])

or, in a custom loop, ``diloco = DiLoCo(model.trainable_variables, sync_every=100)`` and ``diloco.step()`` after
each of the inner optimizer's steps. Streaming's staggered fragments (``fragments`` F) are here; its overlap of
an exchange with the following inner steps, and elastic jobs, are only in the PyTorch one: here a change of the
workers during a round raises WorkersChanged (docs/diloco.md).
"""
from __future__ import annotations

import numpy as np

from pushpull.outer import DEFAULTS, OuterSGD, fragments as _fragments, settings
from pushpull.worker import broadcast as _bc
from pushpull.worker.context import CONTEXT as _ctx
from pushpull.worker.context import distributed as _distributed
from pushpull.worker.table import KeySpec
from pushpull.worker.handle import PushPullError

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_NAMES: dict[str, int] = {}  # DiLoCo names used in this process: a second one gets keys of its own


def _numpy(v) -> np.ndarray:
    return np.array(v.numpy(), order="C")


class DiLoCo:
    """Outer rounds over ``variables`` (the model's trainable ones): :meth:`step` after each inner step, and
    :meth:`sync` where every worker must hold the global parameters (evaluation, saving, the end)."""

    def __init__(self, variables, sync_every: int = 100, outer_lr: float = DEFAULTS["outer_lr"],
                 outer_momentum: float = DEFAULTS["outer_momentum"], nesterov: bool = DEFAULTS["nesterov"],
                 fragments: int = 1, compression=None, name: str = "diloco"):
        for what, v in (("sync_every", sync_every), ("fragments", fragments)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{what} must be an integer >= 1, got {v!r}")
        _ctx.need_init()
        self.outer = settings({"outer_lr": outer_lr, "outer_momentum": outer_momentum, "nesterov": nesterov})
        self.vars = list(variables)
        if not self.vars:
            raise ValueError("DiLoCo needs at least one variable")
        # the index makes a name unique (a Keras path holds per-process layer counters, which may differ by rank)
        self.names = [f"{i}.{v.name}" for i, v in enumerate(self.vars)]
        start = [_numpy(v) for v in self.vars]
        for n, a in zip(self.names, start):
            if a.dtype not in _FLOATS:
                raise TypeError(f"DiLoCo: variable {n!r} is {a.dtype}; the outer step needs float32 or float64 "
                                f"variables")
        if fragments > len(self.vars):
            raise ValueError(f"fragments ({fragments}) must not exceed the variables ({len(self.vars)})")
        self.fragments = _fragments([int(np.prod(v.shape)) for v in self.vars], fragments)
        # every rank makes its DiLoCos in the same order: the n-th of a name has the same keys everywhere, and a
        # second one (a second fit with a new callback) does not meet the first one's rounds on the servers
        _NAMES[name] = _NAMES.get(name, 0) + 1
        self.name = name if _NAMES[name] == 1 else f"{name}.{_NAMES[name]}"
        self.sync_every, self.compression = sync_every, compression
        self.spec = KeySpec(kind="diloco", op="outer", meta=tuple(sorted(self.outer.items())))
        self.steps = 0   # inner steps taken
        self.rounds = 0  # outer rounds completed, of any fragment (the start counts one)
        self._ids = 0    # outer rounds started: each round's id, the same on every worker
        self._local: dict[str, OuterSGD] = {}  # a job of one worker: the outer state is here
        self._synced = [0] * len(self.fragments)  # the step of each fragment's last round
        eng = _ctx.engine
        if eng is not None and eng.joined_late:
            raise PushPullError(f"{name}: this worker came into a running job; the TensorFlow/Keras DiLoCo does not "
                                f"take workers into a running job (pushpull.torch.DiLoCo does)")
        if _distributed():  # every worker starts from rank 0's variables (checked: the same set on every rank)
            start = _bc.broadcast_checked(list(zip(self.names, start)), 0, f"{self.name}.start.")
            for v, arr in zip(self.vars, start):
                v.assign(arr)
        self._global = [np.array(a, order="C") for a in start]
        self._round(list(range(len(self.vars))), start=True)  # the servers' global parameters: rank 0's

    def _round(self, idx: list[int], start: bool = False) -> None:
        """One outer round of variables ``idx``: their pseudo-gradients (at the start, the variables) go to the
        servers, and every worker takes the new global parameters."""
        self._ids += 1
        pushes = [np.ascontiguousarray(self._global[i] if start else self._global[i] - _numpy(self.vars[i]))
                  for i in idx]
        if _ctx.engine is None:  # one worker: the same outer step here
            outs = []
            for i, x in zip(idx, pushes):
                st = self._local.setdefault(self.names[i], OuterSGD(**self.outer, dtype=x.dtype))
                outs.append(st.apply(x, 1).copy())
        else:
            handles = [_ctx.submit_key(x, None, False, f"{self.name}.{self.names[i]}", 0, self.compression,
                                       self.spec, sig=self._ids) for i, x in zip(idx, pushes)]
            outs = [np.asarray(_ctx.synchronize(h)) for h in handles]
        for i, out in zip(idx, outs):
            v = self.vars[i]
            new = out.reshape(v.shape).astype(self._global[i].dtype, copy=False)
            self._global[i] = new.copy()
            v.assign(new)
        self.rounds += 1

    def step(self) -> None:
        """After an inner step: the outer rounds that fall on it (fragment f at the steps where
        ``(step - f * H // F) % H == 0``)."""
        self.steps += 1
        h, count = self.sync_every, len(self.fragments)
        for f in range(count):
            offset = self.steps - f * h // count
            if offset > 0 and offset % h == 0:
                self._round(self.fragments[f])
                self._synced[f] = self.steps

    def sync(self) -> None:
        """An outer round of every variable now (a collective: every worker calls it at the same point), after
        which every worker holds the global parameters. Where every fragment had its round at this step already,
        it does nothing: a round of zero pseudo-gradients would still move the parameters by the momentum."""
        if all(s == self.steps for s in self._synced):
            return
        self._round([i for frag in self.fragments for i in frag])
        self._synced = [self.steps] * len(self.fragments)
