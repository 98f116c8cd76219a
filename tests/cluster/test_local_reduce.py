"""The hierarchical local reduce (pushpull/worker/local_reduce.py): real scheduler, server and worker
processes on loopback, each 'machine' a ``pushpull launch`` of BYTEPS_LOCAL_SIZE processes with its own
DMLC_WORKER_ID, as on a real cluster; the processes of a machine share memory, the machines share nothing."""
from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from pushpull.worker.local_reduce import pid_dead, shm_dir

ROOT = Path(__file__).resolve().parents[2]
LOCAL_WORKER = str(ROOT / "tests" / "scripts" / "local_worker.py")
PP_WORKER = str(ROOT / "tests" / "scripts" / "pp_worker.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(machines: int, local_size: int, cmd: list[str], env: dict | None = None, servers: int = 2,
            timeout: float = 120, check: bool = True) -> str:
    """Scheduler, ``servers`` servers and ``machines`` worker machines of ``local_size`` processes each;
    the combined output of every process (the test fails if any exits non-zero)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    base.update({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(_port()),
                 "DMLC_NUM_WORKER": str(machines), "DMLC_NUM_SERVER": str(servers),
                 "BYTEPS_LOCAL_SIZE": str(local_size), "PUSHPULL_SECRET": secrets.token_hex(16),
                 "PUSHPULL_LOCAL_REDUCE": "1", "PYTHONPATH": str(ROOT), "BYTEPS_PARTITION_BYTES": "65536"})
    base.update(env or {})
    launch = [sys.executable, "-m", "pushpull", "launch"]
    procs = [subprocess.Popen(launch, env=dict(base, DMLC_ROLE="scheduler"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT)]
    procs += [subprocess.Popen(launch, env=dict(base, DMLC_ROLE="server"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT) for _ in range(servers)]
    procs += [subprocess.Popen(launch + ["--", sys.executable, *cmd], env=dict(base, DMLC_ROLE="worker",
                               DMLC_WORKER_ID=str(m)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=ROOT) for m in range(machines)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n".join(outs)
    assert not check or all(p.returncode == 0 for p in procs), text[-5000:]
    return text


def test_a_zombie_counts_as_dead():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    while not pid_dead(p.pid):  # exited, not yet reaped: a zombie
        pass
    assert pid_dead(p.pid)
    p.wait()
    assert not pid_dead(os.getpid())


def test_exact_sums_and_averages_and_each_process_pushes_its_slice():
    out = run_job(2, 2, [LOCAL_WORKER, "wire"], env={"WANT_LOCAL": "1", "WIRE_PAUSE": "7"})
    assert out.count("WIRE-OK") == 4 and out.count("ALL-OK") == 4, out[-3000:]


def test_the_off_switch_pushes_whole_tensors():
    out = run_job(2, 2, [LOCAL_WORKER, "wire"], env={"WANT_LOCAL": "0", "PUSHPULL_LOCAL_REDUCE": "0"})
    assert out.count("WIRE-OK") == 4 and out.count("ALL-OK") == 4, out[-3000:]


def test_the_api_cases_give_the_flat_results_through_the_local_reduce():
    # every dtype and shape (0-d, empty, fewer elements than processes), averages of integers, 1000 small
    # tensors in flight, 50 rounds with drifting ranks, overlapping handles, a repeated name refused
    out = run_job(2, 2, [PP_WORKER, "dtypes", "many", "rounds", "overlap"], timeout=180)
    assert out.count("ALL-OK") == 4 and "FAIL" not in out, out[-3000:]


def _params(out: str) -> dict[int, np.ndarray]:
    return {int(m.group(1)): np.array([float(v) for v in m.group(2).split()])
            for m in re.finditer(r"PARAMS rank (\d+) (.*)", out)}


def test_distributed_optimizer_trains_as_the_flat_path_does():
    hier = _params(run_job(2, 2, [LOCAL_WORKER, "train"]))
    flat = _params(run_job(2, 2, [LOCAL_WORKER, "train"], env={"PUSHPULL_LOCAL_REDUCE": "0"}))
    assert sorted(hier) == sorted(flat) == [0, 1, 2, 3]
    for r in range(4):
        assert np.array_equal(hier[r], hier[0])  # every rank holds the same model
        # the same averaged gradients up to the order of float additions (flat: the servers' arrival order)
        np.testing.assert_allclose(hier[r], flat[r], rtol=1e-5, atol=1e-6)


def test_a_dead_local_peer_fails_the_others_within_seconds_naming_it():
    # one machine of two processes; the scheduler would notice the death only after 30 s
    before = set(os.listdir(shm_dir()))
    out = run_job(1, 2, [LOCAL_WORKER, "dead"], env={"PUSHPULL_HEARTBEAT_TIMEOUT": "30"}, servers=1,
                  check=False)  # the job fails: one of its processes died
    m = re.search(r"DEAD-ERROR after ([\d.]+)s: (.*)", out)
    assert m, out[-3000:]
    assert float(m.group(1)) < 3.0, m.group(0)
    assert "local rank(s) [1]" in m.group(2) and "died" in m.group(2) and "dead.second" in m.group(2), m.group(2)
    # the survivor exits with os._exit (no clean shut-down), yet leaves no shared memory behind
    assert not {f for f in set(os.listdir(shm_dir())) - before if f.startswith("pushpull-")}
