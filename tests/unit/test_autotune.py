"""Auto-tuning of partition size and credit (pushpull.torch.autotune): the search space, the search and the
tuner in this process; two workers tuning in a real job: tests/cluster/test_autotune.py."""
from __future__ import annotations

import math

import pytest

from pushpull.torch.autotune import AutoTuner, Search, Space, read_log

M = 1_000_000


def test_space_follows_facts_and_scales_to_the_model():
    big = Space.for_model(340 * M)                       # BERT-large: ByteScheduler's ranges, in fp32 bytes
    assert big.partition == (2 * M * 4, 32 * M * 4) and big.credit == (1 * M * 4, 16 * M * 4)
    assert Space.for_model(340 * M, backend="allreduce").credit == (4 * M * 4, 64 * M * 4)
    small = Space.for_model(85_002)                      # the test MLP: up to the whole model
    assert small.partition[1] == 85_002 * 4 and abs(small.partition[0] - 85_002 * 4 // 16) <= 4
    assert small.credit[1] == 85_002 * 4 // 2
    assert Space.for_model(10).partition[0] == 1024      # never below the engine's minimum
    assert Space.for_model(340 * M, scale=0.5).partition == (M * 4, 16 * M * 4)
    assert big.clamp(4096000, 0) == (8 * M, 64 * M)      # credit 0 (unlimited) -> the largest


def test_search_ask_tell_converges_near_the_optimum():
    space = Space((1024, 1 << 24), (1024, 1 << 24))
    opt = (40_000, 600_000)

    def f(p, c):
        return math.log2(p / opt[0]) ** 2 + 0.5 * math.log2(c / opt[1]) ** 2

    s = Search(space, n_startup=10, n_trials=30, sampler="tpe", seed=0, baseline=(4096000, 0))
    first = s.ask()
    assert (first["partition_bytes"], first["credit_bytes"]) == (4096000, 1 << 24)  # the baseline, clamped
    s.tell(f(first["partition_bytes"], first["credit_bytes"]))
    n = 1
    while (x := s.ask()) is not None:
        assert space.partition[0] <= x["partition_bytes"] <= space.partition[1]
        assert space.credit[0] <= x["credit_bytes"] <= space.credit[1]
        s.tell(f(x["partition_bytes"], x["credit_bytes"]))
        n += 1
    assert n == 40
    best = s.best
    assert best["value"] == min(h["value"] for h in s.history)
    # within a factor ~1.4 of the optimum in partition size and ~1.7 in credit (the space spans 2^14)
    assert best["value"] < 0.25, best
    with pytest.raises(RuntimeError):
        s.tell(1.0)


def test_tuner_measures_windows_and_keeps_the_best(tmp_path):
    """No cluster: a fake clock whose step time depends on the applied setting."""
    now = [0.0]
    applied = []

    def step_time(p, c):
        return 0.010 + 0.002 * abs(math.log2(p / 60_000)) + 0.001 * abs(math.log2(c / 30_000))

    t = AutoTuner(model_elements=85_002, itemsize=4, n_startup=4, n_trials=4, window=3, warmup=2, sampler="tpe",
                  log_path=tmp_path / "r{rank}.jsonl", broadcast=lambda v: v, apply=lambda p, c: applied.append((p, c)),
                  clock=lambda: now[0], rank=0)
    assert applied == [t.space.clamp(4096000, 0)]  # no config: baseline = the largest point
    for _ in range(100):
        now[0] += step_time(*t.setting)
        t.step()
    assert t.done
    recs = read_log(tmp_path / "r0.jsonl")
    trials = [r for r in recs if r["event"] == "trial"]
    assert len(trials) == 8
    for r in trials:  # the objective is exactly the step time: warm-up dropped, decisions not counted
        assert r["steps"] == 3
        assert r["step_time_s"] == pytest.approx(step_time(r["partition_bytes"], r["credit_bytes"]))
    best = min(trials, key=lambda r: r["step_time_s"])
    (b,) = [r for r in recs if r["event"] == "best"]
    assert (b["partition_bytes"], b["credit_bytes"]) == (best["partition_bytes"], best["credit_bytes"])
    applies = [r for r in recs if r["event"] == "apply"]
    assert applies[-1]["final"] and applied[-1] == (best["partition_bytes"], best["credit_bytes"])
    # trial 0 also spends one untimed step; then a decision every warmup + window steps
    assert [r["step"] for r in applies] == [0] + [6 + 5 * i for i in range(8)]
    assert len(applied) == 9 and t.setting == applied[-1]


def test_tuner_refuses_workers_out_of_step():
    t = AutoTuner(model_elements=1000, n_startup=1, n_trials=0, window=1, warmup=0, sampler="tpe",
                  broadcast=lambda v: [v[0] + 1] + v[1:], apply=lambda p, c: None, clock=lambda: 0.0, rank=1)
    t.step()
    with pytest.raises(RuntimeError, match="out of step"):
        t.step()
