"""DistributedOptimizer wraps the user's optimizer without copying it: a learning-rate scheduler built on the
optimizer before wrapping, and a checkpoint saved from it, see the wrapped one's steps (as in Horovod)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def bps():
    import pushpull.torch as bps

    bps.init()
    yield bps
    bps.shutdown()


def _wrapped(bps):
    model = torch.nn.Linear(3, 2)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, inner, bps.DistributedOptimizer(inner, named_parameters=model.named_parameters())


def _step(model, opt):
    opt.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    opt.step()


def test_a_scheduler_built_on_the_wrapped_optimizer_sets_the_rate_it_steps_with(bps):
    model, inner, opt = _wrapped(bps)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1 / (s + 1))
    for _ in range(3):
        _step(model, opt)
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 4)


def test_the_wrapped_optimizers_state_follows_the_steps(bps):
    model, inner, opt = _wrapped(bps)
    _step(model, opt)
    _step(model, opt)
    saved = inner.state_dict()["state"]
    assert saved and all(int(s["step"]) == 2 for s in saved.values())


def test_state_loaded_before_wrapping_is_kept(bps):
    model = torch.nn.Linear(3, 2)
    first = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, first)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inner.load_state_dict(first.state_dict())
    opt = bps.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    _step(model, opt)
    assert all(int(s["step"]) == 2 for s in opt.state_dict()["state"].values())


def test_a_checkpoint_loaded_into_the_distributed_optimizer_keeps_the_scheduler_working(bps):
    model, inner, opt = _wrapped(bps)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1 / (s + 1))
    _step(model, opt)
    opt.load_state_dict(opt.state_dict())
    sched.step()
    _step(model, opt)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 2)
    assert all(int(s["step"]) == 2 for s in inner.state_dict()["state"].values())



def test_a_group_added_after_wrapping_is_refused_naming_the_fix(bps):
    model, inner, opt = _wrapped(bps)
    extra = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(NotImplementedError, match="before wrapping"):
        opt.add_param_group({"params": [extra]})


def test_diloco_refuses_a_distributed_optimizer_as_its_inner_one(bps):
    model, inner, opt = _wrapped(bps)
    with pytest.raises(ValueError, match="not a DistributedOptimizer"):
        bps.DiLoCo(opt, model.named_parameters(), sync_every=2)
