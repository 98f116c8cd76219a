"""The outer optimizer of DiLoCo and local SGD (pushpull/outer.py) without processes: it steps as
torch.optim.SGD does on the mean pseudo-gradient (Nesterov, heavy ball, none), its first round is the
start, and bad settings are refused naming the setting. The servers' and the workers' use of it:
tests/cluster/test_diloco.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pushpull.outer import OuterSGD, settings
from pushpull.server.keystate import KeyState, RoundError
from pushpull.server.declare import outer_problem


@pytest.mark.parametrize("lr,mu,nesterov", [(0.7, 0.9, True), (0.5, 0.8, False), (1.0, 0.0, False)])
def test_steps_as_torch_sgd_on_the_mean(lr, mu, nesterov):
    rng = np.random.default_rng(0)
    start = rng.standard_normal(10).astype(np.float32)
    outer = OuterSGD(lr, mu, nesterov)
    np.testing.assert_allclose(outer.apply(start * 3, 3), start, rtol=1e-6)   # the first round: the start
    p = torch.nn.Parameter(torch.from_numpy(start.copy()))
    ref = torch.optim.SGD([p], lr=lr, momentum=mu, nesterov=nesterov)
    for _ in range(4):
        pushes = rng.standard_normal((3, 10)).astype(np.float32)
        got = outer.apply(pushes.sum(0), 3)
        p.grad = torch.from_numpy(pushes.mean(0))
        ref.step()
        np.testing.assert_allclose(got, p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_local_sgd_is_the_mean_of_the_local_parameters():
    outer = OuterSGD(**settings({"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}))
    glob = outer.apply(np.array([2.0, 2.0], np.float32), 1).copy()
    local = [np.array([1.0, 3.0], np.float32), np.array([0.0, 5.0], np.float32)]
    got = outer.apply(sum(glob - x for x in local), 2)
    np.testing.assert_allclose(got, np.mean(local, axis=0))


def test_a_round_without_pushes_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        OuterSGD(0.7, 0.9, True).apply(np.zeros(2, np.float32), 0)


@pytest.mark.parametrize("meta,needle", [({"outer_lr": 0, "outer_momentum": 0.9, "nesterov": True}, "outer_lr"),
                                         ({"outer_lr": float("nan"), "outer_momentum": 0.9, "nesterov": True}, "outer_lr"),
                                         ({"outer_lr": 0.7, "outer_momentum": 1.0, "nesterov": True}, "outer_momentum"),
                                         ({"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": "yes"}, "nesterov"),
                                         ({"outer_lr": 0.7, "outer_momentum": 0.0, "nesterov": True}, "nesterov"),
                                         ({}, "outer_lr")])
def test_bad_settings_are_refused_naming_the_setting(meta, needle):
    with pytest.raises(ValueError, match=needle):
        settings(meta)


@pytest.mark.parametrize("decl,needle", [({"dtype": "int32", "compression": None}, "floating-point"),
                                         ({"dtype": "float32", "compression": None, "meta": {"outer_lr": -1}},
                                          "outer_lr")])
def test_the_server_refuses_an_outer_key_it_cannot_step(decl, needle):
    full = {"name": "diloco.w", "meta": {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}, **decl}
    assert needle in outer_problem(full)


def test_the_server_takes_a_good_outer_key():
    assert outer_problem({"name": "diloco.w", "dtype": "bfloat16", "compression": None,
                          "meta": {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}}) is None


def _outer_key(workers: int = 2) -> KeyState:
    ks = KeyState(9, "diloco.w", "float32", 3, workers)
    ks.op, ks.outer = "outer", OuterSGD(1.0, 0.0, False)
    return ks


def _push(ks, rid, rank, values):
    return ks.outer_push(rid, rank, np.array(values, np.float32), (b"w", rank, rid, 1))


def test_an_outer_round_completes_with_every_worker_and_answers_them_all():
    ks = _outer_key()
    assert _push(ks, 1, 0, [2, 2, 2]) is None
    start = _push(ks, 1, 1, [2, 2, 2])
    assert [w[1] for w in start.waiting] == [0, 1] and list(start.out) == [2, 2, 2]
    _push(ks, 2, 0, [1, 1, 1])
    done = _push(ks, 2, 1, [3, 3, 3])  # local SGD: the mean pseudo-gradient (2) off the global (2)
    assert list(done.out) == [0, 0, 0] and ks.outer_done[0] == 2


def test_a_stepped_round_pushed_again_answers_its_step_not_a_second_one():
    ks = _outer_key()
    _push(ks, 1, 0, [2, 2, 2]), _push(ks, 1, 1, [2, 2, 2])
    _push(ks, 2, 0, [1, 1, 1]), _push(ks, 2, 1, [1, 1, 1])
    ks.reset(2)  # the workers changed after the step, before every answer arrived
    again = _push(ks, 2, 1, [1, 1, 1])
    assert list(again.out) == [1, 1, 1] and ks.outer.rounds == 2 and again.waiting == [(b"w", 1, 2, 1)]


def test_an_open_round_is_dropped_by_a_change_and_completes_with_the_workers_left():
    ks = _outer_key(3)
    _push(ks, 1, 0, [2, 2, 2]), _push(ks, 1, 1, [2, 2, 2]), _push(ks, 1, 2, [2, 2, 2])
    _push(ks, 2, 0, [9, 9, 9])  # the pushes of a round the lost worker never joined
    ks.reset(2)
    assert _push(ks, 2, 0, [1, 1, 1]) is None  # the retry: only this generation's pushes count
    assert list(_push(ks, 2, 1, [3, 3, 3]).out) == [0, 0, 0]


@pytest.mark.parametrize("newcomer_first", [True, False])
def test_a_newcomers_push_present_only_completes_the_round_without_counting(newcomer_first):
    """A worker that came into the running job pushes the round it arrived in present but adding nothing: the
    round waits for it (every worker of the job) and steps on the others' mean, whatever the order."""
    ks = _outer_key(3)
    for r in range(3):
        _push(ks, 1, r, [2, 2, 2])
    newcomer = lambda: ks.outer_push(2, 2, np.full(3, 50, np.float32), (b"w", 2, 2, 1), counts=False)  # noqa: E731
    if newcomer_first:
        assert newcomer() is None
    _push(ks, 2, 0, [1, 1, 1])
    last = _push(ks, 2, 1, [3, 3, 3]) if newcomer_first else (_push(ks, 2, 1, [3, 3, 3]), newcomer())[1]
    assert list(last.out) == [0, 0, 0] and sorted(w[1] for w in last.waiting) == [0, 1, 2]


def test_a_deadline_round_with_only_a_newcomers_push_keeps_the_parameters():
    ks = _deadline_key(1.0)
    for r in range(3):
        ks.outer_push(1, r, np.full(3, 4.0, dtype=np.float32), ("w", r))
    ks.outer_push(2, 2, np.zeros(3, dtype=np.float32), ("w", 2), counts=False)
    (slot, missing), = ks.outer_overdue(ks.outer_rounds[2].opened + 1.5)
    assert missing == [0, 1] and list(slot.out) == [4, 4, 4] and ks.outer.rounds == 1


@pytest.mark.parametrize("first,rid,needle", [(False, 2, "holds no global parameters"),
                                              (True, 1, "older than the last one stepped")])
def test_rounds_that_cannot_be_stepped_are_refused(first, rid, needle):
    ks = _outer_key(1)
    if first:
        _push(ks, 1, 0, [1, 1, 1]), _push(ks, 2, 0, [1, 1, 1])
        rid = 1
    with pytest.raises(RoundError, match=needle):
        _push(ks, rid, 0, [1, 1, 1])


def test_a_rank_pushing_an_open_round_twice_is_refused():
    ks = _outer_key()
    _push(ks, 1, 0, [1, 1, 1])
    with pytest.raises(RoundError, match="pushed twice"):
        _push(ks, 1, 0, [1, 1, 1])


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "soon", True])
def test_a_bad_round_deadline_is_refused_naming_it(value):
    from pushpull.outer import round_deadline

    with pytest.raises(ValueError, match="round_deadline"):
        round_deadline({"round_deadline": value})


def _deadline_key(deadline, workers=3):
    ks = KeyState(9, "diloco.w", "float32", 3, workers)
    ks.outer = OuterSGD(0.7, 0.9, True)
    ks.outer_deadline = deadline
    return ks


def test_auto_waits_for_everyone_until_three_rounds_were_measured():
    ks = _deadline_key("auto")
    ks.outer_spans = [0.01, 0.02]
    assert ks.outer_deadline_s() is None
    ks.outer_spans = [0.5, 1.0, 2.0]
    assert ks.outer_deadline_s() == pytest.approx(3.0)   # 3 x the median
    ks.outer_spans = [0.01, 0.01, 0.02]
    assert ks.outer_deadline_s() == pytest.approx(2.0)   # the floor


def test_an_overdue_round_steps_on_the_pushes_it_has_and_a_late_push_gets_its_result():
    ks = _deadline_key(1.0)
    start = np.zeros(3, dtype=np.float32)
    for r in range(3):  # the start round: every worker pushes the parameters
        ks.outer_push(1, r, start, ("w", r))
    ks.outer_push(2, 0, np.ones(3, dtype=np.float32), ("w", 0))
    ks.outer_push(2, 1, np.ones(3, dtype=np.float32), ("w", 1))
    assert ks.outer_overdue(ks.outer_rounds[2].opened + 0.5) == []
    (slot, missing), = ks.outer_overdue(ks.outer_rounds[2].opened + 1.5)
    assert missing == [2] and sorted(slot.pushed) == [0, 1] and ks.outer_done[0] == 2
    late = ks.outer_push(2, 2, np.full(3, 9.0, dtype=np.float32), ("w", 2))
    assert late.ready and np.array_equal(late.out, slot.out)  # not counted: the stepped result


def test_without_a_deadline_no_round_is_ever_overdue():
    ks = _deadline_key(None)
    ks.outer_push(1, 0, np.zeros(3, dtype=np.float32), ("w", 0))
    assert ks.outer_overdue(ks.outer_rounds[1].opened + 1e6) == []
