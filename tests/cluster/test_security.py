"""Security by default (docs/security.md), with real processes on loopback: a peer without the job
secret gets no reply and changes no sum, nodes listen only where they advertise, a node without a
secret stops at once saying how to set one."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRANGER = str(ROOT / "tests" / "scripts" / "stranger_worker.py")


def _run_stranger_job(auth: str) -> str:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1",
            "--env", f"PUSHPULL_AUTH={auth}", "--env", "PUSHPULL_SERVER_MAX_KEYS=500", "--", sys.executable, STRANGER]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert out.count("ALL-OK") == 2, out[-3000:]
    return out


@pytest.fixture(scope="module")
def auto_job() -> str:
    return _run_stranger_job("auto")


@pytest.mark.parametrize("what", ["REGISTER to the scheduler", "INIT to the server", "PUSH of a real key as rank 1",
                                  "PUSH on the server's local socket"])
@pytest.mark.parametrize("creds", ["none", "another job's secret"])
def test_stranger_gets_no_reply(auto_job, creds, what):
    assert f"no reply to a stranger ({creds}): {what}" in auto_job


def test_sums_stay_exact_after_strangers_pushed(auto_job):
    assert "FAIL" not in auto_job  # the script checks three exact rounds after the strangers' pushes


@pytest.mark.parametrize("role", ["scheduler", "server"])
def test_nodes_listen_only_on_the_advertised_address(auto_job, role):
    assert f"LISTEN {role} on 127.0.0.1" in auto_job, auto_job[-2000:]
    assert [ln for ln in auto_job.splitlines() if f"LISTEN {role}" in ln and "127.0.0.1" not in ln] == []


def test_stranger_gets_no_reply_with_curve_everywhere():
    out = _run_stranger_job("curve")
    assert out.count("no reply to a stranger") == 8, out[-3000:]
    assert "worker 0 reaches server 0 at ipc://@" in out, out[-3000:]  # CURVE on the local socket too


def test_workers_reach_a_server_on_loopback_by_its_local_socket(auto_job):
    assert "worker 0 reaches server 0 at ipc://@" in auto_job, auto_job[-2000:]


@pytest.mark.parametrize("role", ["scheduler", "server"])
def test_role_without_secret_stops_at_once_saying_how_to_set_one(role):
    """Between machines (a scheduler address that is not loopback; TEST-NET-1, never routed): no local
    secret stands in, the role stops before it binds or connects."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    env.update({"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "192.0.2.1", "DMLC_PS_ROOT_PORT": "1",
                "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1"})
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "pushpull", "launch"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "PUSHPULL_SECRET" in res.stderr and "PUSHPULL_AUTH=none" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 20


def test_a_member_cannot_push_as_another_rank(auto_job):
    assert "forged sender answered ERROR" in auto_job


def test_a_key_flood_is_refused_beyond_the_limit(auto_job):
    m = re.search(r"key flood: (\d+) of (\d+) INITs refused", auto_job)
    assert m and int(m.group(1)) >= 2000, auto_job[-2000:]


def test_an_oversized_frame_gets_no_answer_and_the_server_lives_on(auto_job):
    assert "oversized frame answered: False" in auto_job  # and the rounds after it are exact (ALL-OK)


def test_server_memory_stays_bounded_under_flood_and_oversized_frame(auto_job):
    m = re.search(r"server RSS (\d+) kB -> (\d+) kB", auto_job)
    assert m, auto_job[-2000:]
    assert int(m.group(2)) - int(m.group(1)) < 32 * 1024  # a 64 MiB frame was never buffered
