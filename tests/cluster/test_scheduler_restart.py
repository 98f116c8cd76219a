"""A lost scheduler costs the job a second or two and no step (issue 30, item 2): under
``pushpull launch --restart-scheduler 1`` rank 0 SIGKILLs the scheduler mid-run; the workers and servers keep
training, the launcher starts a new scheduler at the same address, every node registers with it again and it
rebuilds the membership, the tensors' placements and the barrier count from them. Real processes, real
sockets (tests/scripts/scheduler_restart_worker.py); one reported test per case."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "scripts" / "scheduler_restart_worker.py"

_runs: dict = {}


def _job(case: str) -> str:
    if case not in _runs:
        workers, flags, mode = {"steady": (2, [], []), "lose": (3, ["--min-workers", "2"], ["lose"]),
                                "stop": (2, ["--env", "PUSHPULL_HEARTBEAT_TIMEOUT=3"], ["stop"])}[case]
        argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", "2",
                "--restart-scheduler", "2", *flags, "--env", "PUSHPULL_TIMEOUT=30", "--env", "OMP_NUM_THREADS=1",
                "--", sys.executable, str(WORKER), *mode]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        _runs[case] = out
    return _runs[case]


def _rows(out: str) -> dict:
    return {int(r): (int(n), w, int(rec), int(ch), float(t)) for r, n, w, rec, ch, t in re.findall(
        r"RESTART rank (\d) of (\d): 50 steps, wrong sums (\[.*?\]), recoveries (\d+), changes (\d+), "
        r"slowest step ([\d.]+)s", out)}


def test_the_job_goes_on_with_exact_sums_through_a_new_scheduler():
    out = _job("steady")
    rows = _rows(out)
    assert sorted(rows) == [0, 1], out[-3000:]
    assert all(w == "[]" and rec == 1 and ch == 0 for _, w, rec, ch, _ in rows.values()), rows
    assert "took the running job over" in out and "started scheduler (restart 1)" in out, out[-3000:]


def test_the_outage_costs_a_few_seconds_not_a_step():
    """The slowest step is the one whose new tensor and barrier waited for the new scheduler (about the
    launcher's 0.5 s plus the start of a Python process here); the others never wait for it."""
    rows = _rows(_job("steady"))
    assert rows and max(t for *_, t in rows.values()) < 5.0, rows


def test_a_worker_lost_after_the_takeover_is_handled_by_the_new_scheduler():
    out = _job("lose")
    rows = _rows(out)
    assert sorted(rows) == [0, 1], out[-3000:]
    assert all(n == 2 and w == "[]" and rec == 1 and ch >= 1 for n, w, rec, ch, _ in rows.values()), rows
    assert re.search(r"\[scheduler \(restart 1\)\].*worker rank 2 .* failed.*going on with 2 workers", out), out[-3000:]


def test_a_hung_scheduler_is_named_killed_and_replaced_after_a_first_takeover():
    """SIGKILL, then SIGSTOP of the scheduler that took over: the connection stays up, so the nodes notice the
    silence (PUSHPULL_HEARTBEAT_TIMEOUT=3 here), name the new scheduler's pid (its book's, given at the
    takeover), and the launcher kills it and starts a third; the sums stay exact."""
    out = _job("stop")
    rows = _rows(out)
    assert sorted(rows) == [0, 1], out[-3000:]
    assert all(w == "[]" and rec == 2 and ch == 0 for _, w, rec, ch, _ in rows.values()), rows
    assert re.search(r"pushpull launch: scheduler \(restart 1\) \(pid \d+\) is hung .*killing it", out), out[-3000:]
    assert "started scheduler (restart 2)" in out, out[-3000:]
