"""The gradient noise scale estimator of benchmarks/noise_scale.py (McCandlish et al., arXiv 1812.06162), on
synthetic gradients whose true gradient and noise are known."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "noise_scale.py"
_spec = importlib.util.spec_from_file_location("noise_scale", _PATH)
ns = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ns)

DIM, SMALL = 1000, 2
TRUE_G2, WINDOW_VARIANCE = 1.0, 0.01  # |G|^2, and each coordinate's variance for one window's gradient
TRUE_B = DIM * WINDOW_VARIANCE / TRUE_G2  # tr(Sigma)/|G|^2 = 10 windows


def _gram(draws: int, seed: int = 0, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.full((DIM,), (TRUE_G2 / DIM) ** 0.5, dtype=torch.float64)
    v = g + torch.randn(draws, DIM, generator=gen, dtype=torch.float64) * (WINDOW_VARIANCE / SMALL) ** 0.5
    v = v * scale
    return v @ v.T


def test_it_recovers_a_known_noise_scale():
    assert ns.noise_scale(_gram(200), SMALL)["b_noise"] == pytest.approx(TRUE_B, rel=0.1)


def test_it_recovers_the_true_gradients_squared_norm():
    assert ns.noise_scale(_gram(200), SMALL)["g2"] == pytest.approx(TRUE_G2, rel=0.1)


def test_it_recovers_the_trace_of_one_windows_covariance():
    assert ns.noise_scale(_gram(200), SMALL)["trace"] == pytest.approx(DIM * WINDOW_VARIANCE, rel=0.05)


def test_the_true_value_lies_within_three_jackknife_errors():
    r = ns.noise_scale(_gram(50, seed=1), SMALL)
    assert r["b_noise_se"] is not None and abs(r["b_noise"] - TRUE_B) < 3 * r["b_noise_se"]


def test_more_draws_give_a_smaller_jackknife_error():
    many, few = ns.noise_scale(_gram(400, seed=2), SMALL), ns.noise_scale(_gram(20, seed=2), SMALL)
    assert many["b_noise_se"] < few["b_noise_se"]


def test_the_gradients_scale_does_not_move_it():
    assert (ns.noise_scale(_gram(50, seed=3, scale=1e3), SMALL)["b_noise"]
            == pytest.approx(ns.noise_scale(_gram(50, seed=3), SMALL)["b_noise"], rel=1e-9))


def test_draws_that_cancel_leave_it_unresolved_not_negative():
    g = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    r = ns.noise_scale(g @ g.T, SMALL)
    assert r["g2"] < 0 and r["b_noise"] is None


def test_one_draw_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        ns.noise_scale(torch.ones(1, 1, dtype=torch.float64), SMALL)


def _tiny_model():
    pytest.importorskip("transformers")
    import argparse

    torch.manual_seed(0)
    return ns.dq.model(argparse.Namespace(n_embd=16, n_layer=1, n_head=2))


def test_measuring_leaves_the_models_gradients_as_they_were():
    import contextlib

    m = _tiny_model()
    text = torch.randint(0, 256, (4096,))
    x = ns.dq.windows(text, torch.tensor([0, 100]))
    m(input_ids=x, labels=x).loss.backward()
    before = [p.grad.clone() for p in m.parameters()]
    ns.measure(m, text, 2, 4, torch.Generator().manual_seed(0), contextlib.nullcontext())
    assert all(torch.equal(a, p.grad) for a, p in zip(before, m.parameters()))


def test_measuring_random_text_at_the_start_gives_a_positive_noise_scale():
    import contextlib

    r = ns.measure(_tiny_model(), torch.randint(0, 256, (4096,)), 2, 8, torch.Generator().manual_seed(0),
                   contextlib.nullcontext())
    assert r["g2"] > 0 and r["b_noise"] > 0
