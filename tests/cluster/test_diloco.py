"""DiLoCo and local SGD (pushpull.torch.DiLoCo) under the real launcher with 2 and 3 workers over 2
servers, and in one process alone: after 3 outer rounds of 3 inner steps every rank holds exactly the
parameters a reference computes alone (every rank's inner steps replayed, torch.optim.SGD as the outer
optimizer), for DiLoCo's Nesterov settings, plain local SGD and heavy-ball momentum
(tests/scripts/diloco_worker.py); ranks that disagree on the outer settings all fail, naming them. One reported test per case and worker count."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "scripts" / "diloco_worker.py"
sys.path.insert(0, str(WORKER.parent))
import diloco_worker  # noqa: E402

_runs: dict = {}


def _job(workers: int) -> str:
    if workers not in _runs:
        if workers == 1:
            argv = [sys.executable, str(WORKER)]
        else:
            argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", "2",
                    "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1", "--", sys.executable, str(WORKER)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert out.count("ALL-DONE") == workers, out[-4000:]
        _runs[workers] = out
    return _runs[workers]


def _assert_case(case: str, workers: int) -> None:
    out = _job(workers)
    failed = [ln for ln in out.splitlines() if f"CASE {case} FAIL" in ln]
    assert not failed, "\n".join(failed)
    assert len(re.findall(rf"CASE {case} ok ", out)) == workers, out[-3000:]


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("case", list(diloco_worker.CASES))
def test_diloco_matches_the_reference(case, workers):
    _assert_case(case, workers)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_synchronous_start_then_diloco_matches_the_reference(workers):
    """DistributedOptimizer for two steps, its remove_hooks(), then DiLoCo over the same inner optimizer
    (post-local SGD; tests/scripts/diloco_worker.py after_synchronous_start)."""
    _assert_case("after_sync", workers)


@pytest.mark.parametrize("workers", [2, 3])
def test_ranks_that_disagree_on_the_outer_settings_all_fail_naming_them(workers):
    _assert_case("disagree", workers)


@pytest.mark.parametrize("workers", [2, 3])
def test_int8_pseudo_gradients_keep_the_ranks_equal_and_near_the_reference(workers):
    _assert_case("int8", workers)


def test_digits_example_reaches_its_accuracy_with_diloco():
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1", "--env", "OMP_NUM_THREADS=1",
            "--", sys.executable, str(ROOT / "examples" / "train_digits.py"), "--diloco", "10", "--no-progress",
            "--min-accuracy", "0.95"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = res.stdout + res.stderr
    final = re.search(r"final: test_accuracy=([\d.]+).*bytes/step=(\d+) of (\d+)", out)
    assert res.returncode == 0 and final and float(final.group(1)) >= 0.95, out[-3000:]
    assert int(final.group(2)) * 5 < int(final.group(3)), out[-1000:]  # an outer round every 10 steps, not each


def test_a_lost_worker_costs_one_rounds_share_and_the_others_go_on():
    """--min-workers 2: the worker started as rank 2 is SIGKILLed between two outer rounds; the other two take
    the change inside DiLoCo (no restore), the next rounds average their two pushes, and both end with the
    reference's parameters (tests/scripts/diloco_worker.py churn)."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--min-workers", "2",
            "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1", "--", sys.executable, str(WORKER), "churn"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "going on with 2 workers" in out, out[-3000:]
    assert len(re.findall(r"CASE churn ok ", out)) == 2 and "CASE churn FAIL" not in out, out[-3000:]


@pytest.mark.parametrize("config", list(diloco_worker.JOIN_CONFIGS))
def test_a_replacement_comes_in_where_the_others_are_and_counts_from_its_next_round(config):
    """--min-workers 2 --restart-workers 1: the worker started as rank 2 is SIGKILLed after 8 inner steps; the
    launcher starts it again and it comes into the running DiLoCo job as rank 2 at the others' step. All three
    end with the parameters of a reference that averages the two survivors until the newcomer's first round
    and all three after it, so the newcomer neither diluted the round it came in (it pushes that one present
    but adding nothing) nor missed a later one (tests/scripts/diloco_worker.py join)."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--min-workers", "2",
            "--restart-workers", "1", "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1", "--",
            sys.executable, str(WORKER), "join", config]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "CASE join FAIL" not in out, out[-4000:]
    oks = dict(re.findall(r"CASE join ok rank (\d) of 3 \((newcomer at step \d+|welcomed 1)\)", out))
    assert sorted(oks) == ["0", "1", "2"], out[-4000:]
    assert oks["0"] == oks["1"] == "welcomed 1" and oks["2"].startswith("newcomer"), oks


def test_a_straggler_past_the_round_deadline_does_not_hold_the_others():
    """DiLoCo(round_deadline="auto"), 3 workers, the worker of rank 2 stalls 6 s before a round: the others'
    round completes after the deadline (the 2 s floor) without it, the server says so naming it, and after
    sync() all three hold identical parameters (tests/scripts/diloco_deadline_worker.py)."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "1", "--env",
            "OMP_NUM_THREADS=1", "--", sys.executable, str(ROOT / "tests" / "scripts" / "diloco_deadline_worker.py")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    rows = {int(r): (float(t), s) for r, t, s in
            re.findall(r"DEADLINE rank (\d): step 10 took ([\d.]+)s; identical parameters (\w+)", out)}
    assert sorted(rows) == [0, 1, 2], out[-3000:]
    assert all(s == "True" for _, s in rows.values()), out[-3000:]
    assert rows[0][0] < 4.5 and rows[1][0] < 4.5, rows  # not the 6 s the straggler slept
    assert re.search(r"completed after its deadline .* rank\(s\) \[2\] had not pushed", out), out[-3000:]


@pytest.mark.parametrize("config", list(diloco_worker.JOIN_CONFIGS))
def test_a_lost_servers_outer_state_is_seeded_from_the_workers(config):
    """--servers 2 --min-workers 2: a server holding some of the outer keys is SIGKILLed between the first and
    the second outer round that has momentum; its keys move to the other server, which starts them from the
    workers' seeds (global parameters, momentum inferred), and all three ranks end within 1e-5 of the
    undisturbed reference (tests/scripts/diloco_worker.py server_loss)."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--min-workers", "2",
            "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1", "--", sys.executable, str(WORKER), "loss",
            config]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "partition(s) move to the other 1 server(s)" in out, out[-3000:]
    assert len(re.findall(r"CASE loss ok rank \d", out)) == 3 and "CASE loss FAIL" not in out, out[-3000:]


def test_a_replacement_server_comes_in_and_the_outer_keys_stay_where_their_state_is_exact():
    """As above with --restart-servers 1 and a longer, slowed run: the launcher starts the lost server again and
    it takes the lost one's place; the plain keys that left it move back, the outer keys stay on the survivor,
    and all three ranks still end within 1e-5 of the undisturbed reference."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--min-workers", "2",
            "--restart-servers", "1", "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1", "--",
            sys.executable, str(WORKER), "loss", "diloco", "replaced"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert re.search(r"a replacement server \(pid \d+ on \S+\) takes server \d's place; [1-9]\d* partition", out), \
        out[-3000:]
    assert len(re.findall(r"CASE loss ok rank \d", out)) == 3 and "CASE loss FAIL" not in out, out[-3000:]
