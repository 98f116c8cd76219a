"""DistributedOptimizer and ScheduledOptimizer wrap the user's optimizer without copying it: a learning-rate
scheduler built on the optimizer before wrapping, and a checkpoint saved from it, see the wrapped one's steps (as in
Horovod), also after a checkpoint is loaded into the wrapper."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def bps():
    import pushpull.torch as bps

    bps.init()
    yield bps
    bps.shutdown()


WRAPPERS = ("DistributedOptimizer", "ScheduledOptimizer")


def _wrap(bps, kind, model, inner):
    if kind == "DistributedOptimizer":
        return bps.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    return bps.ScheduledOptimizer(model, inner)


def _wrapped(bps, kind="DistributedOptimizer"):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, inner, _wrap(bps, kind, model, inner)


def _step(model, opt, seed=0):
    """One step on inputs that differ per seed (with one constant gradient Adam's update would not depend on its
    step count, and a lost state could not show)."""
    opt.zero_grad()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
    model(x).pow(2).sum().backward()
    opt.step()
    if hasattr(opt, "synchronize"):
        opt.synchronize()


@pytest.mark.parametrize("kind", WRAPPERS)
def test_a_scheduler_built_on_the_wrapped_optimizer_sets_the_rate_it_steps_with(bps, kind):
    model, inner, opt = _wrapped(bps, kind)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1 / (s + 1))
    for _ in range(3):
        _step(model, opt)
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 4)


@pytest.mark.parametrize("kind", WRAPPERS)
def test_the_wrapped_optimizers_state_follows_the_steps(bps, kind):
    model, inner, opt = _wrapped(bps, kind)
    _step(model, opt)
    _step(model, opt)
    saved = inner.state_dict()["state"]
    assert saved and all(int(s["step"]) == 2 for s in saved.values())


@pytest.mark.parametrize("kind", WRAPPERS)
def test_state_loaded_before_wrapping_is_kept(bps, kind):
    model = torch.nn.Linear(3, 2)
    first = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, first)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inner.load_state_dict(first.state_dict())
    opt = _wrap(bps, kind, model, inner)
    _step(model, opt)
    assert all(int(s["step"]) == 2 for s in opt.state_dict()["state"].values())


@pytest.mark.parametrize("kind", WRAPPERS)
def test_a_checkpoint_loaded_into_the_wrapper_keeps_the_scheduler_working(bps, kind):
    model, inner, opt = _wrapped(bps, kind)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1 / (s + 1))
    _step(model, opt)
    opt.load_state_dict(opt.state_dict())
    sched.step()
    _step(model, opt)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 2)
    assert all(int(s["step"]) == 2 for s in inner.state_dict()["state"].values())


@pytest.mark.parametrize("kind", WRAPPERS)
def test_steps_after_a_checkpoint_is_loaded_continue_from_the_loaded_state(bps, kind):
    """Save after one step, take two more, load the checkpoint, step: the parameters are those of two plain steps
    (a wrapper that kept stepping its old state would be a step count and two moments off)."""
    import copy

    model, inner, opt = _wrapped(bps, kind)
    _step(model, opt, seed=1)
    saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
    _step(model, opt, seed=2)
    _step(model, opt, seed=3)
    model.load_state_dict(saved[0])
    opt.load_state_dict(saved[1])
    _step(model, opt, seed=2)
    torch.manual_seed(0)
    plain_model = torch.nn.Linear(3, 2)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-3)
    _step(plain_model, plain, seed=1)
    _step(plain_model, plain, seed=2)
    for name, value in plain_model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, msg=name)
    assert all(int(s["step"]) == 2 for s in opt.state_dict()["state"].values())


@pytest.mark.parametrize("kind", WRAPPERS)
def test_a_group_added_after_wrapping_is_refused_naming_the_fix(bps, kind):
    model, inner, opt = _wrapped(bps, kind)
    extra = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(NotImplementedError, match="before wrapping"):
        opt.add_param_group({"params": [extra]})


def test_diloco_refuses_a_distributed_optimizer_as_its_inner_one(bps):
    model, inner, opt = _wrapped(bps)
    with pytest.raises(ValueError, match="not a DistributedOptimizer"):
        bps.DiLoCo(opt, model.named_parameters(), sync_every=2)


@pytest.mark.parametrize("kind", WRAPPERS)
def test_a_scheduler_on_the_wrapped_optimizer_does_not_warn_it_was_stepped_first(bps, kind):
    """torch warns when a scheduler steps before its optimizer did; the wrapper's step is the wrapped one's."""
    import warnings

    model, inner, opt = _wrapped(bps, kind)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1 / (s + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(model, opt)
        sched.step()
