"""The simulator's all-reduce path runs the backend's tensor fusion (:mod:`pushpull.policy.collective_fusion`,
:mod:`pushpull.torch.allreduce_backend`): rank 0's dispatcher takes what was admitted in one pass, announces
it in one order message, and its small tasks share collectives. The runtime side of the same rule:
tests/unit/test_allreduce_fusion.py."""
from __future__ import annotations

import pytest

from pushpull.profiles import LayerProfile, Profile, TensorSpec
from pushpull.sim import ClusterConfig, simulate
from pushpull.sim.synthetic import synthetic_profile

ALPHA = 1e-3   # per-message latency: a tiny collective over 4 ranks costs 6 ms in the model


def _ring(**kw) -> ClusterConfig:
    return ClusterConfig(workers=4, bandwidth=float("inf"), backend="allreduce", latency=ALPHA, **kw)


def test_many_small_tensors_ready_at_once_cost_two_collectives_not_one_each():
    # 200 tensors ready together: the first is announced alone (6 ms order message, then its 6 ms
    # collective); the 199 submitted meanwhile are the next batch, one order message and ONE collective
    res = simulate(synthetic_profile([[16] * 200]), _ring(), "wfbp")
    assert res.n_collectives == 2
    assert res.iteration_s == pytest.approx(3 * 6 * ALPHA)


def test_without_fusion_every_tensor_would_pay_a_collective():
    # the same tensors, each larger than a fused buffer's share, are reduced one collective each
    big = 5 * 1024 * 1024 // 4   # 5 MiB float32: above the 4 MiB fusion limit
    res = simulate(synthetic_profile([[big] * 5]), _ring(), "wfbp")
    assert res.n_collectives == 5


def test_a_batch_is_what_was_released_during_the_previous_order_message():
    # one tensor per layer, layers ready 4 ms apart: an order message (6 ms) spans one or two releases
    prof = synthetic_profile([16] * 10, fwd_s=0.0, bwd_s=4e-3)
    res = simulate(prof, _ring(), "wfbp")
    assert 2 < res.n_collectives < 10


def test_order_message_cost_can_be_set_apart_from_the_latency():
    # dispatch_s prices rank 0's order message on its own (a host probe measures it beside gloo)
    one = synthetic_profile([16])
    assert simulate(one, _ring(dispatch_s=0.0), "wfbp").iteration_s == pytest.approx(6 * ALPHA)
    assert simulate(one, _ring(dispatch_s=2e-3), "wfbp").iteration_s == pytest.approx(8 * ALPHA)


def test_dispatch_s_rejects_a_negative_time():
    with pytest.raises(ValueError, match="dispatch_s"):
        _ring(dispatch_s=-1.0)


def test_grouping_matches_the_runtime_on_the_same_batch():
    """A batch of mixed sizes and dtypes: the simulator's collectives are the ones the runtime's
    fuse_groups makes of the same partitions (in admission order)."""
    from pushpull import dtypes
    from pushpull.torch.allreduce_backend import fuse_groups

    specs = [("a", 10, "float32"), ("b", 2_000_000, "float32"), ("c", 300, "float32"), ("d", 300, "float16"),
             ("e", 900_000, "float16"), ("f", 5, "float32"), ("g", 1_000_000, "float32"),
             ("h", 1_000_000, "float32"), ("i", 1_000_000, "float32"), ("j", 1_000_000, "float32"),
             ("k", 1_000_000, "float32"), ("l", 7, "float32")]
    # layer 0 ready last; the backward releases the tensors of the one layer in reverse: "first" leads
    # (its own batch), then every other tensor is released while that order message is out
    layers = [LayerProfile("all", 0.0, 0.0, [TensorSpec(n, k, d) for n, k, d in reversed(specs)]),
              LayerProfile("first", 0.0, 0.0, [TensorSpec("first", 4, "float32")])]
    res = simulate(Profile("mixed", layers, batch_size=1, device="-", source="-"), _ring(), "wfbp")
    states = [st for st in res._trace["phase"].states if st.task.name != "first"]
    states.sort(key=lambda st: st.rec["order"])
    sim_groups: dict[tuple, list[str]] = {}
    for st in states:
        sim_groups.setdefault(st.rec["allreduce"], []).append(st.task.name)
    code = {"float32": dtypes.torch_table()[__import__("torch").float32].header,
            "float16": dtypes.torch_table()[__import__("torch").float16].header}
    by = {n: (k, d) for n, k, d in specs}
    names = [st.task.name for st in states]
    items = [(by[n][0], 2 if by[n][1] == "float16" else 4, code[by[n][1]]) for n in names]
    runtime = [[names[i] for i in g] for g in fuse_groups(items)]
    assert list(sim_groups.values()) == runtime
    # the case splits on size (b alone), dtype (c | d e | f) and the 16 MiB buffer (f..j | k l)
    assert runtime == [["a"], ["b"], ["c"], ["d", "e"], ["f", "g", "h", "i", "j"], ["k", "l"]]
