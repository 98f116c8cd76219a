"""The DiLoCo quality benchmark's reading of its curves: what another method's held-out loss is worth in
synchronous steps, and the table that sets every point beside the synchronous run's at the same step."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "diloco_quality.py"
_spec = importlib.util.spec_from_file_location("diloco_quality", _PATH)
dq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dq)

SYNC = [(0, 5.5), (100, 3.0), (200, 2.0)]


def test_a_loss_between_two_points_is_worth_the_step_interpolated_between_them():
    assert dq.sync_steps_to(SYNC, 2.5) == pytest.approx(150.0)


def test_a_loss_no_lower_than_the_start_is_worth_no_steps():
    assert dq.sync_steps_to(SYNC, 6.0) == 0.0


def test_a_loss_the_synchronous_run_never_reached_is_worth_none():
    assert dq.sync_steps_to(SYNC, 1.0) is None


def test_a_curve_without_its_start_cannot_place_a_loss_above_its_first_point():
    assert dq.sync_steps_to(SYNC[1:], 3.5) is None


def test_the_curve_table_gives_each_point_beside_the_synchronous_one_at_the_same_step():
    sync = {"method": "sync", "held_out_curve": SYNC, "held_out_loss": 2.0, "steps": 200}
    other = {"method": "diloco100", "held_out_curve": [(0, 5.5), (200, 2.2)], "held_out_loss": 2.2, "steps": 200}
    lines = dq.curves([sync, other], sync)
    assert "| 200 | 2.0000 | 2.2000 (+10.0 %) |" in lines
    assert "| 100 | 3.0000 |  |" in lines
    assert "| diloco100 | 2.2000 | 180 | 90 % |" in lines


def _library(top: Path, names: list[str]) -> None:
    for n in names:
        (top / n).parent.mkdir(parents=True, exist_ok=True)
        (top / n).write_text(f"# {n}\n")


# a library's own files on both sides of "site-packages" in path order, as the standard library's are
OWN = [f"m{i:02d}.py" for i in range(20)] + [f"x{i:02d}.py" for i in range(21)]


def test_the_held_out_files_are_every_20th_of_the_librarys_own_and_not_its_tests(tmp_path):
    _library(tmp_path, OWN + ["test/t.py", "pkg/tests/u.py"])
    train, held = dq.corpus(root=str(tmp_path))
    assert held == b"# m00.py\n\n# x00.py\n\n# x20.py\n\n"
    assert b"t.py" not in train + held and b"u.py" not in train + held and train.count(b"# ") == 38


def test_what_is_installed_in_site_packages_does_not_move_the_split(tmp_path):
    _library(tmp_path, OWN)
    before = dq.corpus(root=str(tmp_path))
    _library(tmp_path, ["site-packages/a.py", "site-packages/b/c.py"])
    assert dq.corpus(root=str(tmp_path)) == before


def test_the_rate_warms_up_over_the_first_twentieth_of_the_steps():
    assert [dq.rate(s, 200, "constant") for s in (0, 9, 10)] == [pytest.approx(0.1), 1.0, 1.0]


def test_a_cosine_rate_ends_at_a_tenth_of_its_peak():
    assert dq.rate(200, 200, "cosine") == pytest.approx(0.1)


def test_inner_sgd_is_sgd_with_nesterov_momentum_0_9():
    import torch

    opt = dq.inner_optimizer("sgd", [torch.nn.Parameter(torch.zeros(2))], 0.03)
    group = opt.param_groups[0]
    assert type(opt) is torch.optim.SGD and (group["lr"], group["momentum"], group["nesterov"]) == (0.03, 0.9, True)


def test_the_default_inner_optimizer_is_adamw_with_weight_decay_0_01():
    import torch

    opt = dq.inner_optimizer("adamw", [torch.nn.Parameter(torch.zeros(2))], 1e-3)
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["weight_decay"] == 0.01


def _page(inner: str | None) -> str:
    import argparse

    args = argparse.Namespace(workers=4, servers=1, device="cpu", steps=200, batch=8, lr=0.03, schedule="constant",
                              precision="bf16", outer_lr=0.7, outer_momentum=0.9, n_embd=128, n_layer=4, n_head=4,
                              methods="sync,diloco100@lr=0.03", eval_every=0, kill_at=100, eval_windows=256)
    if inner is not None:
        args.inner = inner
    common = {"params": 8e5, "tokens": 819200, "workers": 4, "steps": 200, "wall_s": 10.0, "job_s": 12.0,
              "train_loss_end": 2.0, "held_out_curve": [(200, 2.0)], "device": "cpu"}
    results = [{**common, "method": "sync", "held_out_loss": 2.0, "sync_steps": 200, "outer_rounds": None},
               {**common, "method": "diloco100@lr=0.03", "held_out_loss": 2.2, "sync_steps": 0, "outer_rounds": 2}]
    return dq.report(args, results)


def test_a_page_of_an_sgd_run_names_sgd_and_gives_the_flag_in_its_command():
    page = _page("sgd")
    assert "--inner sgd " in page and "SGD (Nesterov 0.9) (lr 0.03" in page and "SGD (Nesterov 0.9) lr 0.03 |" in page


def test_a_page_from_before_the_flag_names_adamw_and_no_flag():
    page = _page(None)
    assert "--inner" not in page and "AdamW (lr 0.03" in page and "AdamW lr 0.03 |" in page
