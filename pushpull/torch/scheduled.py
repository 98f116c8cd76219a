"""Layer-wise updates (ByteScheduler's ``ScheduledOptimizer``): ``step()`` does
not wait for the reductions; each parameter is updated once its reduced
gradient is back, and a forward pre-hook on each module waits for that
module's parameters only. Communication of the late layers (which are
reduced last) therefore overlaps the next forward pass of the early ones.

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt = bps.ScheduledOptimizer(model, opt)          # instead of DistributedOptimizer
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)  # schedulers work as usual
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step(); sched.step()
    opt.synchronize()   # apply the last step's updates before evaluating/saving

Any torch.optim optimizer works: each parameter gets its own optimizer of the
user's class (PyTorch's per-parameter optimizer pattern), sharing the user
optimizer's ``state`` so ``state_dict()`` is the usual one. The
hyper-parameters of a parameter's group (lr, momentum, ...) are snapshotted
at ``step()`` and copied into its optimizer when the update is applied, so a
learning-rate scheduler stepped after ``step()`` affects the next step only,
exactly as without layer-wise updates.

Where updates run: on the training thread, never on a communication thread
(no locking against the forward pass, no GIL-heavy work on the I/O thread):
``step()`` applies every update whose reduction has already arrived, and each
module's forward pre-hook applies (waiting if needed) those of its own
parameters. A parameter must therefore be used through its own module's
forward; one used before its update is detected and raises.
"""
from __future__ import annotations

import logging

import torch

from pushpull.torch import ops
from pushpull.torch.compression import Compression
from pushpull.torch.executors import make_strategy
from pushpull.torch.hooks import register_step_callback, step_done
from pushpull.torch.optimizer import check_strategy_options, load_into_wrapped, reduces_gradients, share_wrapped

log = logging.getLogger(__name__)


class _Layerwise:
    """Bookkeeping kept off the optimizer's own attributes."""

    def __init__(self, opt, model, base, named_parameters, strategy, compression, options):
        self.params = [p for g in opt.param_groups for p in g["params"]]
        named = list(named_parameters if named_parameters is not None else model.named_parameters())
        by_id = {id(p): n for n, p in named}
        missing = [i for i, p in enumerate(self.params) if id(p) not in by_id]
        if missing:
            raise ValueError(f"ScheduledOptimizer: {len(missing)} parameter(s) of the optimizer (positions "
                             f"{missing[:5]}) are not parameters of the model; layer-wise updates need the "
                             f"model that owns them")
        self.names = {p: by_id[id(p)] for p in self.params}
        self.order = {p: i for i, p in enumerate(self.names)}
        self.group_of = {p: gi for gi, g in enumerate(opt.param_groups) for p in g["params"]}
        self.per_param: dict = {}
        for p in self.params:
            try:
                o = base.__class__([p], **base.defaults)
            except TypeError:
                try:
                    o = base.__class__([p])
                except TypeError as e:
                    raise TypeError(f"ScheduledOptimizer: cannot build a {base.__class__.__name__} for one "
                                    f"parameter ({e}); the optimizer class must accept (params, **defaults)") \
                        from None
            o.state = opt.state  # one state for all: state_dict() of the wrapper stays complete
            self.per_param[p] = o
        self.pending: dict = {}       # param -> (reduced-or-in-flight grad, hyper-parameters at step())
        self.submitted: dict = {}     # params submitted this step, in order
        self.distributed = ops.size() > 1 or ops.config().force_distributed
        self.strategy = None
        self.hooks = []
        if self.distributed:
            # a wire compressor goes to the engine as its spec; a Horovod-style one runs around each reduction
            spec = None if compression is None else (compression.spec if getattr(compression, "wire", False)
                                                     else compression)
            self.strategy = strategy if strategy is not None and not isinstance(strategy, str) else \
                make_strategy(strategy or ops.config().strategy, compression=spec, **options)
            eng = ops.engine()
            if eng is not None:
                eng.use_priority_order()  # the point of layer-wise updates: early layers' pulls first
                eng.fit_default_keys(sum(p.numel() * p.element_size() for p in self.params if p.requires_grad))


class _ScheduledOptimizer(torch.optim.Optimizer):
    """Methods of the wrapper; mixed into a subclass of the user's optimizer class."""

    # ------------------------------------------------------------ hooks --
    def _pp_install(self, model: torch.nn.Module) -> None:
        lw: _Layerwise = self._pp
        seen: set = set()

        def pre_hook(module, _inputs):
            for p in module.parameters(recurse=False):
                if p in lw.order and p not in seen:
                    seen.add(p)
                    lw.order[p] = len(seen) - 1   # exact forward order -> priorities
                if p in lw.pending:
                    self._pp_apply(p)

        for m in model.modules():
            if any(True for _ in m.parameters(recurse=False)):
                lw.hooks.append(m.register_forward_pre_hook(pre_hook))
        if lw.distributed:
            for p in lw.params:
                if p.requires_grad:
                    lw.hooks.append(p.register_post_accumulate_grad_hook(self._pp_on_grad))

    def _pp_on_grad(self, p: torch.nn.Parameter) -> None:
        lw: _Layerwise = self._pp
        if p in lw.pending:
            raise RuntimeError(f"ScheduledOptimizer: parameter {lw.names[p]!r} got a new gradient before its "
                               f"previous update was applied: it was used without running its own module's "
                               f"forward (the pre-hook applies updates). Use DistributedOptimizer for this model.")
        if p in lw.submitted:
            raise RuntimeError(f"ScheduledOptimizer: gradient of {lw.names[p]!r} computed twice before step(); "
                               f"layer-wise updates support one backward pass per step")
        lw.submitted[p] = None
        lw.strategy.on_ready(lw.names[p], p.grad, -lw.order.get(p, 0))

    def _pp_apply(self, p: torch.nn.Parameter) -> None:
        """Wait for ``p``'s reduced gradient and update ``p`` with its own optimizer."""
        lw: _Layerwise = self._pp
        grad, hyper = lw.pending.pop(p)
        if lw.strategy is not None:
            lw.strategy.wait(lw.names[p])
        o = lw.per_param[p]
        o.param_groups[0].update(hyper)
        saved = p.grad
        p.grad = grad
        try:
            o.step()
        finally:
            p.grad = saved

    # ------------------------------------------------------------ API --
    def step(self, closure=None):
        """Submit what backward did not, and return without waiting: updates are
        applied as reductions arrive (here if already back, else in forward pre-hooks)."""
        loss = self._pp_step(closure)
        step_done(self)
        return loss

    register_step_callback = register_step_callback

    def _pp_step(self, closure=None):
        lw: _Layerwise = self._pp
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if lw.pending:  # parameters not used in forward since the last step
            self.synchronize()
        hypers = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        if not lw.distributed:
            for p in lw.params:
                if p.grad is not None:
                    lw.pending[p] = (p.grad, hypers[lw.group_of[p]])
                    self._pp_apply(p)
            return loss
        for p in lw.params:  # parameters without a gradient here take part with zeros
            if p.requires_grad and p not in lw.submitted:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                lw.submitted[p] = None
                lw.strategy.on_ready(lw.names[p], p.grad, -lw.order.get(p, 0))
        lw.strategy.on_backward_done()
        for p in lw.submitted:
            lw.pending[p] = (p.grad, hypers[lw.group_of[p]])
        lw.submitted.clear()
        for p in list(lw.pending):
            if lw.strategy.done(lw.names[p]):
                self._pp_apply(p)
        return loss

    def synchronize(self) -> None:
        """Apply every outstanding update (before evaluation, checkpointing, or at the end)."""
        lw: _Layerwise = self._pp
        for p in list(lw.pending):
            self._pp_apply(p)
        if lw.strategy is not None and not lw.submitted:
            lw.strategy.wait_all()

    def zero_grad(self, set_to_none: bool = True):
        """Like the usual one, but a gradient still being reduced is detached, not zeroed in place."""
        lw: _Layerwise = self._pp
        if lw.submitted:
            names = [lw.names[p] for p in list(lw.submitted)[:3]]
            raise RuntimeError(f"zero_grad() was called after backward() and before step(): the gradients being "
                               f"reduced ({', '.join(names)}, ...) would be lost. Call step() first.")
        for p in lw.params:
            if p.grad is None:
                continue
            if p in lw.pending or set_to_none:
                p.grad = None if set_to_none else torch.zeros_like(p)
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def state_dict(self):
        self.synchronize()
        return super(self.__class__, self).state_dict()  # type: ignore[misc]

    def load_state_dict(self, state_dict) -> None:
        """Loads into the wrapped optimizer, whose state and param groups this one shares, and points every
        parameter's own optimizer at the loaded state (torch's own load would leave them stepping the old one
        while state_dict() showed the new)."""
        if "_inner" not in self.__dict__:  # a copy (copy.deepcopy) shares nothing: torch's own load
            return super(self.__class__, self).load_state_dict(state_dict)  # type: ignore[misc]
        self.synchronize()  # an update still in flight belongs to the state being replaced
        load_into_wrapped(self, state_dict)
        for o in self._pp.per_param.values():
            o.state = self.state

    def add_param_group(self, param_group) -> None:
        if "_inner" in self.__dict__:  # after construction: the new parameters would have no optimizer or hook
            raise NotImplementedError(
                "add_param_group() on a ScheduledOptimizer: its parameters would never be updated; add the group "
                "to your optimizer before wrapping it")
        return super(self.__class__, self).add_param_group(param_group)  # type: ignore[misc]

    def remove_hooks(self) -> None:
        """Detach from the model (e.g. before wrapping it again)."""
        self.synchronize()
        for h in self._pp.hooks:
            h.remove()
        self._pp.hooks.clear()


def ScheduledOptimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, named_parameters=None,
                       strategy=None, compression=Compression.none, **strategy_options):
    """Wrap ``optimizer`` (a plain torch.optim optimizer over ``model``'s
    parameters) for layer-wise updates; reductions use ``strategy`` (default
    PUSHPULL_STRATEGY) over PUSHPULL_BACKEND, priorities from the forward order.

    Returns an instance of a subclass of the optimizer's class that shares its
    ``param_groups``, ``state`` and ``defaults`` (also after ``load_state_dict()``): a
    learning-rate scheduler may be built on either.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"ScheduledOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if reduces_gradients(optimizer):
        raise TypeError("ScheduledOptimizer wraps the plain optimizer (torch.optim.X), not a "
                        "DistributedOptimizer or another ScheduledOptimizer: it reduces gradients itself")
    if isinstance(compression, str):
        compression = Compression.build(compression)
    if strategy is None or isinstance(strategy, str):
        check_strategy_options("ScheduledOptimizer", strategy or ops.config().strategy, strategy_options,
                               {"model", "optimizer", "named_parameters", "strategy", "compression"})
    base = optimizer
    cls = type(base.__class__.__name__, (base.__class__,), dict(_ScheduledOptimizer.__dict__))
    opt = cls.__new__(cls)
    torch.optim.Optimizer.__init__(opt, base.param_groups, base.defaults)
    share_wrapped(opt, base)
    opt._pp = _Layerwise(opt, model, base, named_parameters, strategy, compression, strategy_options)
    opt._pp_install(model)
    return opt
