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
from pushpull.worker.compression import normalize
from pushpull.torch.executors import make_strategy
from pushpull.torch.hooks import register_step_callback, step_done
from pushpull.worker import trace as _trace

log = logging.getLogger(__name__)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, strategy, model,
                 strategy_options, sum_op: bool = False, predivide: float = 1.0, sparse_as_dense: bool = False):
        super(self.__class__, self).__init__(params)  # type: ignore[misc]
        self._compression = compression if compression is not None else Compression.none
        # op=Sum: the averaged gradients times size(), the size of the step's reduction (an elastic job's changes)
        self._sum_op = sum_op
        self._predivide = predivide  # gradient_predivide_factor: 1/f before the reduction, f after
        self._sparse_as_dense = sparse_as_dense
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
            self._names = {p: f"noname.{i}" for i, p in enumerate(all_params)}  # Gradient.noname.<i>
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
            strategy or ops.config().strategy, compression=normalize(self._compression, "DistributedOptimizer"), **opts)
        self._hooks = []
        # backup workers (PUSHPULL_BACKUP_WORKERS): a step may be followed by catch-up steps (catch_up())
        self._backup = ops.config().backup_workers > 0 and ops.engine() is not None
        self.rounds = 0  # optimizer steps taken, catch-up steps included: the same on every worker
        self.catch_up_steps = 0
        self._lr_getter = lambda: self.param_groups[0]["lr"]
        eng = ops.engine()
        if eng is not None:
            eng.set_lr_getter(self._lr_getter)
            # before the first step partitions anything: keys that fit the model (Engine.fit_default_keys)
            eng.fit_default_keys(sum(p.numel() * p.element_size() for p in self._names if p.requires_grad))
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
        if p.grad.is_sparse:
            if not self._sparse_as_dense:
                raise RuntimeError(f"gradient of {self._names[p]!r} is sparse: pushpull reduces dense tensors only; "
                                   f"pass sparse_as_dense=True to DistributedOptimizer, or keep the table on the servers "
                                   f"with pushpull.torch.SparseEmbedding (docs/sparse.md)")
            p.grad = p.grad.to_dense()
        if self._predivide != 1.0:
            p.grad.mul_(1.0 / self._predivide)
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
                elif p.grad.is_sparse and self._sparse_as_dense:
                    p.grad = p.grad.to_dense()
                if self._predivide != 1.0:
                    p.grad.mul_(1.0 / self._predivide)
                self._submitted[p] = None
                self._strategy.on_ready(self._names[p], p.grad, self.priority(p))
        self._strategy.on_backward_done()
        self._strategy.wait_all()
        factor = (float(ops.size()) if self._sum_op else 1.0) * self._predivide
        if factor != 1.0:
            with torch.no_grad():
                for p in self._submitted:
                    p.grad.mul_(factor)
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

    def load_state_dict(self, state_dict) -> None:
        """Loads into the wrapped optimizer, whose state and param groups this one shares: torch's own
        load_state_dict() would make new ones, and a scheduler built on the wrapped optimizer would stop
        setting this one's rate. Load hooks registered on this one run around it."""
        if "_inner" not in self.__dict__:  # a copy (copy.deepcopy) shares nothing: torch's own load
            return super(self.__class__, self).load_state_dict(state_dict)  # type: ignore[misc]
        load_into_wrapped(self, state_dict)

    def add_param_group(self, param_group) -> None:
        if "_inner" in self.__dict__:  # after construction: the new parameters would have no name and no hook
            raise NotImplementedError(
                "add_param_group() on a DistributedOptimizer: its gradients would not be reduced; add the group "
                "to your optimizer before wrapping it")
        return super(self.__class__, self).add_param_group(param_group)  # type: ignore[misc]

    def remove_hooks(self) -> None:
        """Stop reducing gradients: the autograd hooks go, and from here the wrapped optimizer (the same state and
        param groups) steps alone. For a synchronous start followed by DiLoCo over the same inner optimizer
        (post-local SGD; docs/diloco.md). Call it between steps, on every worker at the same step."""
        if self._submitted or self._passes:
            raise RuntimeError("remove_hooks() was called after backward() and before step(): call step() first")
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._detached = True  # step() no longer synchronizes

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
        if self.__dict__.get("_detached"):  # after remove_hooks(): the wrapped optimizer's step alone
            return super(self.__class__, self).step(closure)  # type: ignore[misc]
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
        self.rounds += 1
        if self._backup:
            self.catch_up()
        step_done(self)  # the timeline's step ends here (or at pushpull.torch.trace_step()), then callbacks
        return result

    register_step_callback = register_step_callback

    def catch_up(self) -> int:
        """Backup workers: apply the rounds that completed without this worker (it was late), pulling their
        averaged gradients instead of computing any, so that every worker applies the same sums in the same
        order and a straggler does not hold the others back. Returns the steps taken (``rounds`` counts them)."""
        eng = ops.engine()
        taken = 0
        limit = 4 * ops.config().backup_rounds  # the others may keep completing rounds meanwhile: bounded
        while eng is not None and taken < limit and eng.status.rounds_behind() > 0:
            for p in self._names:
                if p.grad is not None:
                    p.grad.zero_()  # not sent: the engine only pulls a round its servers said had completed
            self.synchronize()
            self._synchronized = False
            super(self.__class__, self).step()  # type: ignore[misc]
            taken += 1
        self.rounds += taken
        self.catch_up_steps += taken
        return taken

    def zero_grad(self, set_to_none: bool = True):
        if self._submitted:
            names = [self._names[p] for p in list(self._submitted)[:3]]
            raise RuntimeError(
                f"zero_grad() was called after backward() and before step(): the gradients being reduced "
                f"({', '.join(names)}, ...) would be lost. Call step() or synchronize() first.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def share_wrapped(wrapper, optimizer) -> None:
    """Make ``wrapper`` use ``optimizer``'s own state, param-group list and defaults, not copies: a learning-rate
    scheduler built on the optimizer before wrapping, or a checkpoint saved from it, sees what the wrapper does
    (Horovod's wrapper shares the groups the same way). ``load_into_wrapped`` keeps them shared."""
    wrapper.param_groups = optimizer.param_groups
    wrapper.defaults = optimizer.defaults
    wrapper.state = optimizer.state
    wrapper._inner = optimizer


def load_into_wrapped(wrapper, state_dict) -> None:
    """A wrapper's load_state_dict(): into the wrapped optimizer, sharing its new state and groups again (torch's
    own load would give the wrapper new ones, and a scheduler built on the wrapped optimizer would stop setting
    the wrapper's rate); the load hooks registered on the wrapper run around it."""
    for hook in wrapper._optimizer_load_state_dict_pre_hooks.values():
        state_dict = hook(wrapper, state_dict) or state_dict
    inner = wrapper._inner
    inner.load_state_dict(state_dict)
    wrapper.param_groups = inner.param_groups
    wrapper.state = inner.state
    for hook in wrapper._optimizer_load_state_dict_post_hooks.values():
        hook(wrapper)


def reduces_gradients(optimizer) -> bool:
    """A DistributedOptimizer or ScheduledOptimizer: it reduces the gradients itself, so it cannot be wrapped again
    (nor be DiLoCo's inner optimizer)."""
    return hasattr(optimizer, "_strategy") or hasattr(optimizer, "_pp")


_HOROVOD_OPTIONS = {"op", "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense", "process_set"}


def _strategy_options(name: str) -> set[str]:
    """Keyword options the strategy called ``name`` takes (its constructors' named parameters)."""
    import inspect

    from pushpull import policy
    from pushpull.torch.executors import _OVERRIDES, strategy_class

    try:
        klass = strategy_class(name)
    except ValueError:
        return set()
    found = set(policy.get(name).options) if name not in _OVERRIDES else set()
    for k in klass.__mro__:
        init = k.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self", "compression"):
                found.add(p.name)
    return found


def check_strategy_options(func: str, strategy: str, options: dict, own: set) -> None:
    """Options that strategy ``strategy`` does not take raise, naming the nearest valid one (or the strategy
    that takes it)."""
    from pushpull.torch.executors import names
    from pushpull.torch.kwargs import unknown_keyword

    allowed = _strategy_options(strategy)
    for k in options:
        if k in allowed:
            continue
        others = [s for s in names() if k in _strategy_options(s)]
        if others:
            raise TypeError(f"{func}() got {k!r}, an option of strategy {' / '.join(map(repr, others))}, not of "
                            f"strategy {strategy!r}")
        raise unknown_keyword(func, k, own | allowed)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         strategy=None, model: torch.nn.Module | None = None, *, op=None,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set=None, asynchronous: bool | None = None,
                         compression_params: dict | None = None, **strategy_options):
    """Wrap ``optimizer`` so that gradients are averaged over all workers.

    ``asynchronous=True`` (default: the BYTEPS_ENABLE_ASYNC setting) trains asynchronously instead: this returns
    :func:`pushpull.torch.AsyncOptimizer` (docs/async.md), which takes none of the options below but
    ``named_parameters``. With PUSHPULL_BACKUP_WORKERS=b, each round completes with the first size() - b workers'
    gradients and a late worker catches up (``rounds`` counts every step, catch-up ones included).

    ``strategy``: 'wfbp' (default from PUSHPULL_STRATEGY), or another registered
    strategy; its options (``threshold_bytes=`` for fusion, ...) are keyword arguments too, and any other
    keyword is an error naming the nearest valid one. ``model``: optional; when given, forward pre-hooks
    record the exact forward order for priorities (otherwise the order of ``named_parameters`` is used for
    the first step, then the reverse of the order in which the first backward pass produced the gradients).
    Horovod's ``op`` (Average, Sum), ``gradient_predivide_factor`` and ``sparse_as_dense`` are taken;
    ``num_groups``/``groups``, ``op=Adasum`` and process sets raise, saying so. Gradients are
    ``Gradient.<parameter name>`` on the servers. BytePS's ``compression_params`` (a dict such as
    ``{"compressor": "onebit", "ef": "vanilla", "scaling": True}``) is the same as ``compression=`` that dict.
    """
    from pushpull.torch import collectives
    from pushpull.torch.functions import _check_global
    from pushpull.torch.kwargs import HOROVOD_ONLY, unknown_keyword

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if compression_params is not None:  # BytePS's name for the compression spec
        if compression not in (None, Compression.none):
            raise ValueError("DistributedOptimizer: give compression= or BytePS's compression_params=, not both")
        if not isinstance(compression_params, dict):
            raise TypeError(f"compression_params must be a dict such as {{'compressor': 'onebit'}}, got "
                            f"{type(compression_params).__name__}")
        compression = dict(compression_params)
    if asynchronous is None:
        asynchronous = ops.config().enable_async
    if asynchronous:
        return _asynchronous(optimizer, named_parameters, compression, backward_passes_per_step, strategy, op,
                             gradient_predivide_factor, sparse_as_dense, strategy_options)
    if isinstance(strategy, int) and not isinstance(strategy, bool):
        raise TypeError("DistributedOptimizer's fifth positional argument is strategy=; pass Horovod's op= by "
                        "keyword (op=pushpull.torch.Sum)")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if num_groups or groups is not None:
        raise NotImplementedError(HOROVOD_ONLY["num_groups" if num_groups else "groups"])
    _check_global(process_set)
    op = collectives.Average if op is None else collectives._op(None, op)
    if op not in (collectives.Average, collectives.Sum):
        raise ValueError(f"DistributedOptimizer reduces gradients with op=Average or op=Sum, not {op!r}")
    if gradient_predivide_factor != 1.0 and op != collectives.Average:
        raise ValueError("gradient_predivide_factor needs op=Average (Horovod's rule)")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    own = {"named_parameters", "compression", "backward_passes_per_step", "strategy", "model",
           "asynchronous", "compression_params"} | _HOROVOD_OPTIONS
    if not isinstance(strategy, str) and strategy is not None:
        if strategy_options:
            raise unknown_keyword("DistributedOptimizer", next(iter(strategy_options)), own)
    else:
        check_strategy_options("DistributedOptimizer", strategy or ops.config().strategy, strategy_options, own)
    if isinstance(compression, str):
        compression = Compression.build(compression)
    elif isinstance(compression, dict):
        compression = Compression.build(**compression)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, strategy,
                  model, strategy_options, sum_op=op == collectives.Sum,
                  predivide=float(gradient_predivide_factor), sparse_as_dense=sparse_as_dense)
    share_wrapped(wrapped, optimizer)
    if ops.config().autotune:  # PUSHPULL_AUTOTUNE=1: the tuner attaches itself to step()
        from pushpull.torch.autotune import AutoTuner

        AutoTuner(wrapped)
    return wrapped


def _asynchronous(optimizer, named_parameters, compression, backward_passes_per_step, strategy, op,
                  gradient_predivide_factor, sparse_as_dense, strategy_options):
    """DistributedOptimizer(asynchronous=True) or BYTEPS_ENABLE_ASYNC=1: the asynchronous optimizer, after
    refusing the synchronous options it would silently ignore (naming the option and where async came from)."""
    from pushpull.torch.asynchronous import AsyncOptimizer

    ignored = {"compression": compression not in (None, Compression.none),
               "backward_passes_per_step": backward_passes_per_step != 1, "strategy": strategy is not None,
               "op": op is not None, "gradient_predivide_factor": gradient_predivide_factor != 1.0,
               "sparse_as_dense": sparse_as_dense}
    bad = [k for k, v in ignored.items() if v] + list(strategy_options)
    if bad:
        why = "asynchronous=True" if not ops.config().enable_async else "asynchronous training (BYTEPS_ENABLE_ASYNC=1)"
        raise ValueError(f"DistributedOptimizer: {why} pushes parameter deltas, it takes no {', '.join(bad)}; "
                         f"drop {'it' if len(bad) == 1 else 'them'} or pass asynchronous=False")
    return AsyncOptimizer(optimizer, named_parameters)
