"""Integration tests: real processes (scheduler, servers, workers) started by the
real launcher, talking over real ZeroMQ sockets on localhost."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_cases import assert_case, shape_runner

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "pp_worker.py")


def launch(workers: int, servers: int, *cases: str, env: dict | None = None, timeout: float = 120,
           port: int | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    if port:
        argv += ["--port", str(port)]
    for k, v in (env or {}).items():
        argv += ["--env", f"{k}={v}"]
    argv += ["--", sys.executable, WORKER, *cases]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def assert_ok(res: subprocess.CompletedProcess, workers: int) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert out.count("ALL-OK") == workers, out[-4000:]


# engines: the servers' summation threads (None: the launcher's choice; 0: on the receiving thread)
SHAPES = {"1w-1s": (1, 1, None), "2w-1s": (2, 1, None), "2w-3s-engines0": (2, 3, "0"), "3w-2s": (3, 2, None),
          "4w-3s-engines4": (4, 3, "4")}
ALL_CASES = ["dtypes", "partitions", "many", "rounds", "direct", "overlap", "priority"]  # pp_worker's "all"


@pytest.fixture(scope="module")
def shape_runs():
    """One launch per cluster shape, shared by that shape's cases (each case is its own reported test)."""
    def launch_shape(shape: str):
        workers, servers, engines = SHAPES[shape]
        env = {"BYTEPS_PARTITION_BYTES": "40000"}
        if engines is not None:
            env["BYTEPS_SERVER_ENGINE_THREAD"] = engines
        if workers == 1:
            env["BYTEPS_FORCE_DISTRIBUTED"] = "1"  # one worker, but through a real server
        return workers, launch(workers, servers, "all", env=env)
    return shape_runner(launch_shape)


@pytest.mark.parametrize("case", ALL_CASES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_case_across_cluster_shapes(shape_runs, shape, case):
    workers, out = shape_runs(shape)
    assert_case(out, case, workers)


def test_every_case_of_all_is_tested():
    """The worker's "all" and the list above agree (a new case is reported, not silently skipped)."""
    src = Path(WORKER).read_text()
    excluded = ("mismatch", "hang", "caught", "lonely", "misnamed", "shm")
    names = re.findall(r'"(\w+)": case_\w+', src)
    assert [n for n in names if n not in excluded] == ALL_CASES


def test_single_process_without_servers_is_local():
    # size 1, no force: push_pull is a local copy, nothing is started
    res = subprocess.run([sys.executable, WORKER, "dtypes", "overlap"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("DMLC")})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ALL-OK" in res.stdout


def test_credit_limited_scheduling_gives_same_sums():
    env = {"BYTEPS_PARTITION_BYTES": "40000", "BYTEPS_SCHEDULING_CREDIT": "2"}
    assert_ok(launch(2, 2, "partitions", "many", "rounds", env=env), 2)


def test_server_schedule_gives_same_sums():
    """BYTEPS_SERVER_ENABLE_SCHEDULE=1 reorders the engine threads' queues (80 kB partitions: queued, not
    summed on arrival); every sum stays exact (the order itself: tests/unit/test_server_schedule.py)."""
    env = {"BYTEPS_PARTITION_BYTES": "80000", "BYTEPS_SERVER_ENABLE_SCHEDULE": "1",
           "BYTEPS_SERVER_ENGINE_THREAD": "2"}
    assert_ok(launch(3, 2, "partitions", "many", "rounds", env=env), 3)


def test_shape_mismatch_raises_on_every_worker_quickly():
    t0 = time.monotonic()
    res = launch(3, 2, "mismatch", timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert out.count("MISMATCH-ERROR") == 3, out[-3000:]
    assert "'allreduce.mismatched'" in out and "rank 0" in out
    assert time.monotonic() - t0 < 30


def test_shutdown_after_a_caught_error_does_not_wait_for_the_others():
    res = launch(3, 1, "caught", timeout=90)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    times = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"SHUTDOWN-AFTER-ERROR rank (\d+) ([\d.]+)s", out)}
    assert sorted(times) == [0, 1, 2], out[-3000:]
    assert times[0] < 4 and times[1] < 4, times  # rank 2 is still busy for 8 s: they did not wait for it


@pytest.mark.parametrize("name,says", [("lonely.new", "rank(s) [1] have not declared it yet"),
                                       ("lonely.ready", "rank(s) [1] have not pushed round 2 of it yet")])
def test_a_timeout_names_the_missing_rank(lonely_job, name, says):
    line = next((ln for ln in lonely_job.splitlines() if f"LONELY {name}:" in ln), "")
    assert "PUSHPULL_TIMEOUT" in line and says in line, lonely_job[-3000:]


@pytest.fixture(scope="module")
def lonely_job() -> str:
    res = launch(2, 1, "lonely", env={"PUSHPULL_TIMEOUT": "3"}, timeout=90)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    return out


def test_differently_named_tensors_fail_every_worker_within_10s():
    res = launch(3, 1, "misnamed", timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    lines = re.findall(r"MISNAMED after ([\d.]+)s: (.*)", out)
    assert len(lines) == 3, out[-3000:]
    for took, text in lines:
        assert float(took) < 10, took
        assert "rank(s) [0] declared 'allreduce.named.a'" in text and "rank(s) [1, 2] declared 'allreduce.named.b'" in text, text


JOIN_WORKER = str(ROOT / "tests" / "scripts" / "join_worker.py")


@pytest.fixture(scope="module")
def join_job() -> str:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--",
            sys.executable, JOIN_WORKER]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    return out


def test_join_sums_only_the_ranks_still_running(join_job):
    assert join_job.count("ALL-OK") == 3 and "FAIL" not in join_job, join_job[-3000:]


def test_join_returns_the_last_rank_to_join_and_the_job_goes_on(join_job):
    assert sorted(re.findall(r"JOIN rank (\d) last (\d) after ([\d.]+)", join_job)) == [
        ("0", "2", "3.0"), ("1", "2", "3.0"), ("2", "2", "3.0")], join_job[-3000:]


def test_a_join_keeps_large_keys_in_shared_memory(join_job):
    """The end of a join() keeps every rank, so servers and workers keep their shared-memory regions: rank r's
    3 (r + 1) pushes of the large key before it and 3 after all go through shared memory."""
    pushes = {int(r): int(c) for r, c in re.findall(r"JOIN-SHM rank (\d) pushes (\d+)", join_job)}
    assert pushes == {r: 3 * (r + 1) + 3 for r in range(3)}, join_job[-3000:]


def _pids_with_port(port: int) -> list[int]:
    """Processes whose environment names this job's scheduler port."""
    marker = f"DMLC_PS_ROOT_PORT={port}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker in (d / "environ").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except (OSError, PermissionError):
            continue
    return pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_sigkilled_worker_stops_the_job_within_10s_and_leaves_nothing():
    from pushpull.launch.cli import free_port

    port = free_port()
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "3", "--servers", "2", "--port", str(port),
            "--", sys.executable, WORKER, "hang"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = []
    try:
        assert proc.stdout is not None
        while sum("READY" in ln for ln in lines) < 3:
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        victims = [p for p in _pids_with_port(port) if b"pp_worker.py" in Path(f"/proc/{p}/cmdline").read_bytes()
                   and b"launch" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(victims) == 3, victims
        t0 = time.monotonic()
        os.kill(victims[0], signal.SIGKILL)
        rc = proc.wait(15)
        took = time.monotonic() - t0
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc != 0
    assert took < 10, f"launcher took {took:.1f}s"
    assert "SIGKILL" in rest and "worker" in rest, rest
    time.sleep(0.5)
    assert _pids_with_port(port) == []


def test_launcher_names_failing_command():
    res = subprocess.run([sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1", "--",
                          sys.executable, "-c", "import sys; sys.exit(7)"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 7
    assert "exit code 7" in res.stderr and "worker" in res.stderr
