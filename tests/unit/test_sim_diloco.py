"""DiLoCo in the simulator and the planner (pushpull.sim.diloco, `pushpull plan --diloco`)."""
from __future__ import annotations

import json
import pytest

from pushpull.sim.config import ClusterConfig, Compression
from pushpull.sim.diloco import DiLoCoSetting, codec_ratio, exchange_s, plan_diloco, predict
from pushpull.sim.synthetic import synthetic_profile
from pushpull.units import rate_bytes

NUMELS = [250_000] * 8  # 8 MB of fp32 in 8 tensors
COMPUTE_S = 0.1


def _profile():
    return synthetic_profile([[n] for n in NUMELS], fwd_s=COMPUTE_S / 3 / len(NUMELS))


def _cluster(rate="100mbit", latency=0.05):
    return ClusterConfig(workers=4, servers=2, bandwidth=rate_bytes(rate), latency=latency)


def test_without_overlap_every_exchange_stalls_the_workers():
    r = predict(_profile(), _cluster(), DiLoCoSetting(100))
    x = exchange_s(NUMELS, _cluster(), 1.0)
    assert r.step_s == pytest.approx((100 * COMPUTE_S + x) / 100)
    assert r.utilisation == pytest.approx(100 * COMPUTE_S / (100 * COMPUTE_S + x))


def test_an_overlap_longer_than_the_exchange_hides_it():
    r = predict(_profile(), _cluster(), DiLoCoSetting(100, 4, 20, "int8"))
    assert r.exchange_s < 20 * COMPUTE_S
    assert r.utilisation == pytest.approx(1.0)


def test_exchanges_overlapping_each_other_are_bound_by_the_link():
    """An overlap longer than a fragment's slot (H/F steps) lets exchanges queue on the link."""
    r = predict(_profile(), _cluster("10mbit"), DiLoCoSetting(10, 4, 5))
    assert r.step_s * 10 == pytest.approx(4 * exchange_s(NUMELS[:2], _cluster("10mbit"), 1.0))


@pytest.mark.parametrize("codec,h", [("none", 100), ("int8", 100), ("none", 10)])
def test_bytes_per_step_are_a_round_over_h(codec, h):
    r = predict(_profile(), _cluster(), DiLoCoSetting(h, 1, 0, codec))
    ratio = codec_ratio(codec, NUMELS[0])
    assert r.fewer_bytes == pytest.approx(2 * h * ratio / (ratio + 1))


def test_int8_ratio_counts_its_block_scales():
    assert codec_ratio("int8", 1 << 20) == pytest.approx(4 * 256 / (256 + 4), rel=0.01)


def test_answers_whole_cost_more_than_compressed_ones_and_less_than_none():
    cl = _cluster()
    from pushpull.sim.events import simulate
    from pushpull.sim.executors import BSP

    prof = synthetic_profile([NUMELS], fwd_s=0.0)
    both = simulate(prof, cl, BSP(compression=Compression(ratio=4.0, min_compress_bytes=0)), trace=False).iteration_s
    up_only = exchange_s(NUMELS, cl, 4.0)
    none = exchange_s(NUMELS, cl, 1.0)
    assert both < up_only < none


def test_the_planner_takes_the_smallest_h_that_keeps_the_target():
    p = plan_diloco(_profile(), _cluster(), target=0.9)
    assert p.best is not None and p.best.utilisation >= 0.9
    smaller = [r for r in p.results if r.setting.sync_every < p.best.setting.sync_every]
    assert smaller and all(r.utilisation < 0.9 for r in smaller)


def test_the_planner_says_none_when_no_setting_reaches_the_target():
    p = plan_diloco(_profile(), _cluster("1mbit", 0.2), target=0.99, h_grid=(10,))
    assert p.best is None


def test_diloco_needs_the_ps_backend():
    cl = ClusterConfig(workers=4, bandwidth=rate_bytes("1gbit"), backend="allreduce")
    with pytest.raises(ValueError, match="servers"):
        predict(_profile(), cl, DiLoCoSetting(100))


def test_plan_cli_recommends_a_setting(capsys):
    from pushpull.sim.cli import plan_main

    rc = plan_main(["--profile", "gpt2", "--workers", "4", "--servers", "2", "--bandwidth", "1gbit", "--latency",
                    "10ms", "--compute-scale", "0.05", "--diloco", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)["diloco"]
    assert d["setting"]["sync_every"] >= 10 and d["utilisation"] >= 0.9


def test_plan_cli_refuses_diloco_over_allreduce(capsys):
    from pushpull.sim.cli import plan_main

    rc = plan_main(["--profile", "gpt2", "--workers", "4", "--bandwidth", "1gbit", "--backend", "allreduce",
                    "--diloco"])
    assert rc == 2 and "servers" in capsys.readouterr().err
