"""The DiLoCo speed benchmark's page: each method's row against the synchronous strategy auto kept, with that
strategy's bound and bytes (a ring moves 2(n-1)/n M each way per step, a PS M), and the planner's overlap."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from pushpull.sim.synthetic import synthetic_profile

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "diloco_speed.py"
_spec = importlib.util.spec_from_file_location("diloco_speed", _PATH)
ds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ds)

NUMELS = [250_000] * 8  # 8 MB of fp32
COMPUTE_S = 0.1


def _profile():
    prof = synthetic_profile([[n] for n in NUMELS], fwd_s=COMPUTE_S / 3 / len(NUMELS))
    prof.batch_size = 32
    return prof


def _args(**kw):
    base = dict(cells="100mbit:50ms", batch=32, n_embd=384, n_layer=6, n_head=6, profile=None, h=100, fragments=4,
                overlap=None, steps=200, sync_steps=10, no_slow_start_after_idle=False)
    return argparse.Namespace(**{**base, **kw})


def _cell(backend: str, sync_bytes: float, diloco_bytes: float):
    def run(step_s, wire, steps=10):
        return {"steps": steps, "wall_s": step_s * steps, "compute_s": COMPUTE_S * steps,
                "rx_per_step": wire / 2, "tx_per_step": wire / 2}
    w = {"local": run(0.11, 0.0), "sync": run(2.0, sync_bytes), "ddp": run(2.5, sync_bytes),
         "diloco": run(0.13, diloco_bytes, 200), "streaming": run(0.102, diloco_bytes / 2, 200)}
    w["sync"]["decision"] = {"final": {"backend": backend, "strategy": "wfbp"}, "kept": "choice", "reason": "why"}
    return {"rate": "100mbit", "delay": "50ms", "rate_Bps": 12.5e6, "overlap": 15, "workers": [w] * 4}


def _row(text: str, method: str) -> list[str]:
    line = next(l for l in text.splitlines() if f"| {method}" in l)
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_sync_row_names_the_backend_auto_kept_and_its_bound():
    text = ds.report(_args(), _profile(), [_cell("allreduce", 24e6, 0.24e6)])
    row = _row(text, "synchronous, auto: allreduce wfbp")
    m = 8e6
    assert row[-1] == f"ring {1e3 * (COMPUTE_S + 1.5 * m / 12.5e6):,.0f}"
    assert _row(text, "synchronous, auto: allreduce wfbp")[3] == f"{COMPUTE_S / 2.0:.3f}"


def test_the_predicted_byte_ratio_is_against_the_ring_when_auto_kept_the_ring():
    ring = ds.predictions(_args(), _profile(), dict(_cell("allreduce", 24e6, 0.24e6), rate_Bps=12.5e6))
    ps = ds.predictions(_args(), _profile(), dict(_cell("ps", 16e6, 0.24e6), rate_Bps=12.5e6))
    assert ring["diloco"][1] == pytest.approx(1.5 * ps["diloco"][1])
    assert ps["diloco"][1] == pytest.approx(2 * 100 / 2)  # 2M per sync step against M up and M down per H steps


def test_measured_byte_ratios_are_against_the_sync_row():
    text = ds.report(_args(), _profile(), [_cell("ps", 16e6, 0.16e6)])
    assert _row(text, "DiLoCo H = 100")[7] == "100.0x"
    assert _row(text, "streaming DiLoCo, F = 4, overlap 15, int8")[7] == "200.0x"


def test_an_unshaped_cell_gets_no_prediction_and_no_bound():
    cell = dict(_cell("ps", 16e6, 0.16e6), rate_Bps=None)
    text = ds.report(_args(), _profile(), [cell])
    assert "(NOT SHAPED)" in text
    assert _row(text, "synchronous, PyTorch DDP")[-1] == ""


def test_a_given_overlap_is_kept_and_otherwise_the_planner_hides_the_exchange():
    cell = {"rate": "100mbit", "delay": "50ms", "rate_Bps": 12.5e6}
    assert ds.streaming_overlap(_args(overlap=3), _profile(), cell) == 3
    t = ds.streaming_overlap(_args(), _profile(), cell)
    from pushpull.sim.diloco import DiLoCoSetting, predict

    x = predict(_profile(), ds.cluster_config(cell), DiLoCoSetting(100, 4, 0, "int8")).exchange_s
    assert t * COMPUTE_S >= x > (t - 1) * COMPUTE_S
