"""Communication strategies without processes: the MG-WFBP and fusion planning functions on
hand-worked examples, the alpha-beta fit, and every strategy against a fake backend. Over both
real backends, under the launcher: tests/cluster/test_strategies.py.
"""
from __future__ import annotations

import pytest
import torch

from pushpull.policy.fusion import fusion_plan
from pushpull.policy.mgwfbp import fit_alpha_beta, mgwfbp_groups

STRATEGIES = ["wfbp", "bsp", "fusion", "mgwfbp", "bytescheduler"]

# --------------------------------------------------------------------------- MG-WFBP, by hand
# Five gradients in ready order (output layer first): ready at 0, 1, 1.5, 10, 20 ms;
# sizes 400 kB, 400 kB, 40 kB, 800 kB and a tiny 400 B (100 elements < 8192: always merged).
READY = [0.0, 0.001, 0.0015, 0.010, 0.020]
SIZES = [400_000, 400_000, 40_000, 800_000, 400]


def test_mgwfbp_hand_worked_slow_network():
    # alpha 0.9 ms, beta 10 ns/B (400 kB = 4 ms).
    # g0 alone would finish at 0 + 0.9 + 4 = 4.9 ms; g1 is ready at 1 ms: in time, but the
    #   extra wait (1 ms) exceeds alpha -> g0 goes alone, the network is busy until 4.9 ms.
    # g1 would start at max(1, 4.9) = 4.9 ms; g2 (1.5 ms) is ready before that: the message
    #   waits for the network anyway -> merge {g1, g2} (440 kB), finishing at 4.9+0.9+4.4 = 10.2 ms.
    # g3 is ready at 10 ms < 10.2 ms but would add a 5.1 ms wait > alpha -> new message.
    # g4 is tiny -> merged into g3's message.
    assert mgwfbp_groups(READY, SIZES, alpha=0.9e-3, beta=1e-8) == [[0], [1, 2], [3, 4]]


def test_mgwfbp_hand_worked_large_alpha_merges_early_layers():
    # alpha 2 ms: g0 would finish at 0+2+4 = 6 ms; g1 (1 ms) adds a 1 ms wait < alpha -> merge.
    # {g0,g1} would start at 1 ms, finish at 1+2+8 = 11 ms; g2 adds 0.5 ms < alpha -> merge.
    # {g0,g1,g2} would start at 1.5 ms, finish at 1.5+2+8.4 = 11.9 ms; g3 (10 ms) is in time but
    # adds 8.5 ms > alpha -> new message; g4 is tiny -> merged into it.
    assert mgwfbp_groups(READY, SIZES, alpha=2e-3, beta=1e-8) == [[0, 1, 2], [3, 4]]


def test_mgwfbp_hand_worked_fast_network_is_wfbp_except_tiny():
    # beta 0.1 ns/B: every message is over before the next gradient is ready -> no merging,
    # except the tiny g4.
    assert mgwfbp_groups(READY, SIZES, alpha=1e-4, beta=1e-10) == [[0], [1], [2], [3, 4]]


def test_fusion_plan_by_cycle_and_threshold():
    ready = [0.0, 0.0004, 0.0012, 0.0013, 0.0031]
    sizes = [10, 10, 10, 100, 10]
    # ticks (1 ms): 0, 1, 2, 2, 4 ms; g2+g3 = 110 bytes fit a 110-byte buffer
    assert fusion_plan(ready, sizes, threshold_bytes=110, cycle_s=1e-3) == [[0], [1], [2, 3], [4]]
    assert fusion_plan(ready, sizes, threshold_bytes=100, cycle_s=1e-3) == [[0], [1], [2], [3], [4]]
    # one long cycle (g0, ready at 0, is seen by tick 0): the rest up to the threshold
    assert fusion_plan(ready, sizes, threshold_bytes=130, cycle_s=1.0) == [[0], [1, 2, 3, 4]]
    assert fusion_plan(ready, sizes, threshold_bytes=120, cycle_s=1.0) == [[0], [1, 2, 3], [4]]


def test_fit_alpha_beta_recovers_a_line():
    a, b = fit_alpha_beta([(x, 2e-4 + 3e-9 * x) for x in (4096, 65536, 524288, 2097152)])
    assert a == pytest.approx(2e-4, rel=1e-6) and b == pytest.approx(3e-9, rel=1e-6)


# --------------------------------------------------------------------------- fake backend
@pytest.fixture(scope="module")
def single_process():
    import pushpull.torch as bps

    bps.init()  # no cluster in the environment: size 1, nothing started
    yield bps


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_writes_back_what_the_backend_returns(single_process, name):
    from fakes import Doubling, drive
    from pushpull.torch.executors import make_strategy

    comm = Doubling()
    opts = {"alpha": 1e-3, "beta": 1e-9} if name == "mgwfbp" else {}
    st = make_strategy(name, comm=comm, **opts)
    drive(st, 4)
    if name in ("bsp", "mgwfbp"):
        assert any("[" in s for s in comm.sent)  # something was fused


def test_unknown_strategy_names_the_choices(single_process):
    from pushpull.torch.executors import make_strategy, names

    assert names() == sorted(STRATEGIES + ["auto"])
    with pytest.raises(ValueError, match="bytescheduler"):
        make_strategy("nope")


# --------------------------------------------------------------------------- benchmark pieces
def test_emulated_model_replays_profile_sizes_and_backward_order():
    from pushpull.bench.emulated_model import EmulatedModel
    from pushpull.profiles import load_profile

    prof = load_profile("resnet50")
    model = EmulatedModel(prof, compute_scale=0.0, size_scale=0.01)
    params = list(model.parameters())
    want = [max(1, round(t.numel * 0.01)) for t in prof.tensors()]
    assert [p.numel() for p in params] == want
    order = []
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i))
    model(torch.zeros(1)).sum().backward()
    layer_of = [li for li, layer in enumerate(prof.layers) for _ in layer.tensors]
    assert len(order) == len(params)
    assert [layer_of[i] for i in order] == sorted((layer_of[i] for i in order), reverse=True)  # output first


def test_bench_cli_names_missing_benchmarks(capsys):
    from pushpull.bench.cli import main

    assert main(["nonsense"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
