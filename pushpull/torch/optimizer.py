"""``DistributedOptimizer``: Horovod's optimizer wrapper, over push_pull.

Each gradient's reduction starts from its autograd hook as soon as it is ready
(with a priority from the parameter's forward position: the layer nearest the
input is the most urgent, which BytePS never set), and ``step()`` waits for
them. The object returned is an instance of the user's optimizer class, so
learning-rate schedulers, ``state_dict`` and GradScaler keep working.

Guard rails raise clear errors: duplicate parameter names, more backward
passes than ``backward_passes_per_step`` before a step, ``zero_grad()``
between backward and step.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict

import torch

from pushpull.torch import ops
from pushpull.torch.compression import Compression
from pushpull.torch.strategies import make_strategy
from pushpull.worker import trace as _trace

log = logging.getLogger(__name__)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, strategy, model,
                 strategy_options):
        super(self.__class__, self).__init__(params)  # type: ignore[misc]
        self._compression = compression if compression is not None else Compression.none
        self.backward_passes_per_step = backward_passes_per_step
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(t, tuple) or len(t) != 2 for t in named_parameters):
                raise ValueError("named_parameters must be a list of (name, parameter) tuples, "
                                 "e.g. model.named_parameters()")
            names = [n for n, _ in named_parameters]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"named_parameters contains duplicate names: {dups}; every parameter needs a "
                                 f"unique name so that all workers reduce the same tensors together")
            by_id = {id(p): n for n, p in named_parameters}
            missing = [i for i, p in enumerate(all_params) if id(p) not in by_id]
            if missing:
                raise ValueError(f"{len(missing)} parameter(s) of the optimizer are not in named_parameters "
                                 f"(positions {missing[:5]}...); pass model.named_parameters() of the same model")
            self._names = {p: by_id[id(p)] for p in all_params}
        else:
            self._names = {p: f"push_pull.noname.{i}" for i, p in enumerate(all_params)}
        # forward order: the order of named_parameters (definition order) until a
        # model hook or the first backward tells us better
        listed = [p for _, p in named_parameters] if named_parameters is not None else list(self._names)
        self._order = {p: i for i, p in enumerate(listed)}
        self._passes: dict[torch.nn.Parameter, int] = {}
        self._submitted: "OrderedDict[torch.nn.Parameter, None]" = OrderedDict()
        self._ready_order: list = []
        self._synchronized = False
        self._should_synchronize = True
        opts = dict(strategy_options or {})
        self._strategy = strategy if not isinstance(strategy, str) and strategy is not None else make_strategy(
            strategy or ops.config().strategy, compression=self._compression.spec, **opts)
        self._hooks = []
        self._lr_getter = lambda: self.param_groups[0]["lr"]
        eng = ops.engine()
        if eng is not None:
            eng.lr_getter = self._lr_getter
        # without the model, learn the forward order once from the first backward pass:
        # gradients become ready in roughly reverse forward order
        self._learn_order = model is None
        if model is not None:
            self._track_forward_order(model)
        if ops.size() > 1 or ops.config().force_distributed:
            for p in self._names:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    # ------------------------------------------------------------ priorities --
    def _track_forward_order(self, model: torch.nn.Module) -> None:
        """Record the order in which modules first run forward: exact forward order."""
        seen: dict = {}

        def pre_hook(module, _inputs):
            for p in module.parameters(recurse=False):
                if p in self._names and p not in seen:
                    seen[p] = len(seen)
                    self._order[p] = seen[p]

        for m in model.modules():
            if any(True for _ in m.parameters(recurse=False)):
                self._hooks.append(m.register_forward_pre_hook(pre_hook))

    def priority(self, p: torch.nn.Parameter) -> int:
        """Larger = more urgent: minus the forward index."""
        return -self._order.get(p, 0)

    # ------------------------------------------------------------ hooks --
    def _on_grad(self, p: torch.nn.Parameter) -> None:
        # any new gradient makes an earlier synchronize() stale, even one that is not submitted yet
        self._synchronized = False
        n = self._passes.get(p, 0) + 1
        self._passes[p] = n
        if p in self._submitted:
            raise RuntimeError(
                f"gradient of {self._names[p]!r} computed again before step(): more than "
                f"backward_passes_per_step={self.backward_passes_per_step} backward passes; call step() (or "
                f"synchronize()) after every {self.backward_passes_per_step} backward pass(es), or raise "
                f"backward_passes_per_step")
        if n < self.backward_passes_per_step:
            return
        self._submitted[p] = None
        self._ready_order.append(p)
        self._strategy.on_ready(self._names[p], p.grad, self.priority(p))

    # ------------------------------------------------------------ API --
    def synchronize(self) -> None:
        """Wait until every gradient is averaged over all workers (Horovod semantics)."""
        if ops.size() == 1 and not ops.config().force_distributed:
            self._passes.clear()
            self._synchronized = True
            return
        tr = _trace.current
        t0 = time.perf_counter() if tr is not None else 0.0
        # parameters that got no gradient on this worker still take part, with zeros,
        # so that workers where they did get one are not left waiting
        for p in self._names:
            if p.requires_grad and p not in self._submitted:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._submitted[p] = None
                self._strategy.on_ready(self._names[p], p.grad, self.priority(p))
        self._strategy.on_backward_done()
        self._strategy.wait_all()
        if self._learn_order and self._ready_order:
            for i, p in enumerate(reversed(self._ready_order)):
                self._order[p] = i
            self._learn_order = False
        self._submitted.clear()
        self._passes.clear()
        self._ready_order.clear()
        self._synchronized = True
        if tr is not None:
            tr.synchronized(t0)

    def reset(self) -> None:
        """Forget the step in progress (elastic training, after WorkersChanged): the reductions it started
        were dropped, so nothing of it is waited for; the next backward starts a fresh step."""
        self._strategy.reset()
        self._submitted.clear()
        self._passes.clear()
        self._ready_order.clear()
        self._synchronized = False

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block ``step()`` does not synchronize (call ``synchronize()`` yourself first),
        e.g. to unscale and clip gradients with a GradScaler."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                log.debug("step(): gradients already synchronized")
            else:
                self.synchronize()
        elif not self._synchronized and self._submitted:
            raise RuntimeError("step() inside skip_synchronize() but synchronize() was not called: "
                               "the gradients have not been reduced yet")
        self._synchronized = False
        result = super(self.__class__, self).step(closure)  # type: ignore[misc]
        if _trace.TRACER is not None:  # one step ends here (or at pushpull.torch.trace_step())
            _trace.TRACER.end_step()
        for fn in self.__dict__.get("_after_step_hooks", ()):  # pushpull.torch.autotune
            fn()
        return result

    def zero_grad(self, set_to_none: bool = True):
        if self._submitted:
            names = [self._names[p] for p in list(self._submitted)[:3]]
            raise RuntimeError(
                f"zero_grad() was called after backward() and before step(): the gradients being reduced "
                f"({', '.join(names)}, ...) would be lost. Call step() or synchronize() first.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         strategy=None, model: torch.nn.Module | None = None, **strategy_options):
    """Wrap ``optimizer`` so that gradients are averaged over all workers.

    ``strategy``: 'wfbp' (default from PUSHPULL_STRATEGY), or another registered
    strategy. ``model``: optional; when given, forward pre-hooks record the
    exact forward order for priorities (otherwise the order of
    ``named_parameters`` is used for the first step, then the reverse of the
    order in which the first backward pass produced the gradients).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if isinstance(compression, str):
        compression = Compression.build(compression)
    elif isinstance(compression, dict):
        compression = Compression.build(**compression)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, strategy,
                  model, strategy_options)
    wrapped.load_state_dict(optimizer.state_dict())
    if ops.config().autotune:  # PUSHPULL_AUTOTUNE=1: the tuner attaches itself to step()
        from pushpull.torch.autotune import AutoTuner

        AutoTuner(wrapped)
    return wrapped
