"""pushpull.torch.DiLoCo's arguments, refused one by one with the setting named, and its fragments (contiguous,
about equal, none empty); in one process (no servers: the outer steps are taken here). The rounds over real
servers: tests/cluster/test_diloco.py."""
from __future__ import annotations

import pytest
import torch

from pushpull.outer import fragments as _fragments


@pytest.fixture(scope="module")
def bps():
    import pushpull.torch as bps

    bps.init()
    return bps


def _make(bps, **kw):
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    return bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), **kw)


@pytest.mark.parametrize("kw,needle", [({"sync_every": 0}, "sync_every"), ({"sync_every": 2.5}, "sync_every"),
                                       ({"fragments": 0}, "fragments"), ({"fragments": 5}, "fragments"),
                                       ({"overlap": -1}, "overlap"), ({"sync_every": 4, "overlap": 4}, "overlap"),
                                       ({"mix": 1.5}, "mix"), ({"outer_lr": 0.0}, "outer_lr"),
                                       ({"outer_momentum": 0.0, "nesterov": True}, "nesterov"),
                                       ({"round_deadline": 0}, "round_deadline"),
                                       ({"round_deadline": "later"}, "round_deadline")],
                         ids=lambda v: str(v))
def test_a_bad_argument_is_refused_naming_it(bps, kw, needle):
    with pytest.raises(ValueError, match=needle):
        _make(bps, **kw)


def test_parameters_missing_from_named_parameters_are_refused(bps):
    m = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="not in named_parameters"):
        bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), [("weight", m.weight)])


def test_one_worker_takes_the_outer_steps_itself(bps):
    opt = _make(bps, sync_every=2, outer_lr=1.0, outer_momentum=0.0, nesterov=False)
    p = opt.params[0][1]
    before = p.detach().clone()
    for _ in range(2):
        opt.zero_grad()
        p.sum().backward()
        opt.step()
    # local SGD with one worker: the global parameters become the local ones
    assert opt.rounds == 2 and opt.pending == 0 and torch.allclose(p, before - 0.2)


@pytest.mark.parametrize("sizes,count,want", [([10, 10, 10, 10], 2, [[0, 1], [2, 3]]),
                                              ([100, 1, 1, 1], 2, [[0], [1, 2, 3]]),
                                              ([1, 1, 1, 100], 3, [[0, 1], [2], [3]]),
                                              ([1, 2, 3], 3, [[0], [1], [2]])])
def test_fragments_are_contiguous_balanced_and_never_empty(sizes, count, want):
    assert _fragments(sizes, count) == want


@pytest.mark.parametrize("setting,theirs", [("sync_every", 7), ("overlap", 1), ("fragments", [[0, 1], [2, 3]])])
def test_a_newcomer_with_other_settings_than_the_running_job_is_refused_naming_the_setting(bps, monkeypatch, setting,
                                                                                           theirs):
    """A worker that comes into a running DiLoCo job follows the schedule rank 0 sends it; with other settings it
    would push other rounds than the others wait for, so it fails at once, naming the setting."""
    from types import SimpleNamespace

    from pushpull.torch import diloco, ops

    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    mine = {"sync_every": 4, "fragments": [[0, 1, 2, 3]], "overlap": 0, "names": [n for n, _ in m.named_parameters()]}
    state = {"steps": 8, "ids": 3, "rounds": 3, "synced": [8], "phase": "step", "open": [], "last_sync": 0,
             "schedule": {**mine, setting: theirs}}
    monkeypatch.setattr(ops, "engine", lambda: SimpleNamespace(joined_late=True, gen=2, arrival_gen=2))
    monkeypatch.setattr(diloco.functions, "broadcast_object", lambda obj, root_rank, name: state)
    monkeypatch.setattr(diloco, "broadcast_parameters", lambda params, root_rank, prefix: None)
    with pytest.raises(bps.PushPullError, match=f"newcomer's {setting}"):
        bps.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), sync_every=4)