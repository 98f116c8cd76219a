"""Roles started BytePS-style from DMLC_* variables, and liveness: a node that
stops answering is declared dead to everyone instead of hanging them."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pushpull.launch.cli import free_port

ROOT = Path(__file__).resolve().parents[2]
BPSLAUNCH = [sys.executable, "-c", "from pushpull.launch.cli import bpslaunch_main; bpslaunch_main()"]


def _env(role: str, port: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    env.update({"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "BYTEPS_LOG_LEVEL": "WARNING",
                "PUSHPULL_SECRET": f"liveness test {port}"})  # multi-machine jobs set the secret themselves
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_byteps_style_roles_from_dmlc_environment():
    """The seed scripts' layout: a scheduler, a server and two worker machines, each started by bpslaunch."""
    port = free_port()
    worker = [sys.executable, str(ROOT / "tests" / "scripts" / "pp_worker.py"), "rounds", "overlap"]
    procs = [subprocess.Popen(BPSLAUNCH, env=_env("scheduler", port)),
             subprocess.Popen(BPSLAUNCH, env=_env("server", port))]
    workers = [subprocess.Popen(BPSLAUNCH + ["--"] + worker, env=_env("worker", port, DMLC_WORKER_ID=i),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    try:
        outs = [w.communicate(timeout=150)[0] for w in workers]
        for w, out in zip(workers, outs):
            assert w.returncode == 0, out[-2000:]
            assert "ALL-OK" in out
        assert "rank 0/2" in outs[0] and "rank 1/2" in outs[1]
        for p in procs:  # scheduler and server leave on their own once the workers finished
            assert p.wait(60) == 0
    finally:
        for p in procs + workers:
            if p.poll() is None:
                p.kill()


def _start_loop_job(port: int, *env: str) -> subprocess.Popen:
    """2 workers running loop_worker.py under the launcher, returned once both printed READY."""
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1", "--port", str(port)]
    for kv in env:
        argv += ["--env", kv]
    argv += ["--", sys.executable, str(ROOT / "tests" / "scripts" / "loop_worker.py")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    while sum("READY" in ln for ln in lines) < 2:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError("".join(lines))
        lines.append(line)
    return proc


def test_frozen_server_is_declared_dead_and_named():
    port = free_port()
    proc = _start_loop_job(port, "PUSHPULL_HEARTBEAT_TIMEOUT=3", "PUSHPULL_HEARTBEAT_INTERVAL=0.5")
    server = None
    try:
        for pid in _job_pids(port):
            try:
                if b"DMLC_ROLE=server" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    server = pid
            except OSError:
                continue
        assert server, "server process not found"
        t0 = time.monotonic()
        os.kill(server, signal.SIGSTOP)  # alive but silent: only heartbeats can tell
        rest = proc.communicate(timeout=60)[0]
        took = time.monotonic() - t0
    finally:
        if server:
            try:
                os.kill(server, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
    errors = [ln for ln in rest.splitlines() if "LIVENESS-ERROR" in ln]
    assert len(errors) == 2, rest[-3000:]
    assert all("server 0" in ln for ln in errors), errors
    assert took < 20, took
    # the launcher blames the frozen server (which never exits), not the first worker to exit because of it
    blame = [ln for ln in rest.splitlines() if ln.startswith("pushpull launch:")]
    assert blame and "server 0" in blame[-1] and "failed first" in blame[-1], blame


def _job_pids(port: int) -> list[int]:
    marker = f"DMLC_PS_ROOT_PORT={port}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def test_job_dies_with_a_sigkilled_launcher():
    """The launcher's children get SIGTERM when it dies (PR_SET_PDEATHSIG): no job runs on unsupervised."""
    port = free_port()
    proc = _start_loop_job(port)
    try:
        assert len(_job_pids(port)) >= 4  # scheduler, server, two workers
        proc.kill()
        proc.wait(5)
        deadline = time.monotonic() + 10
        while _job_pids(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _job_pids(port) == [], "processes outlived their launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _job_pids(port):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("victim,named", [("worker", "worker rank 1"), ("server", "server 0"),
                                          ("scheduler", "scheduler")])
def test_killed_node_without_launcher_is_reported_within_2s(victim, named):
    """BytePS-style roles, no launcher to notice: the closed connection, not the heartbeat timeout (15 s),
    tells the others; the surviving worker's error names the dead node."""
    port = free_port()
    loop = [sys.executable, str(ROOT / "tests" / "scripts" / "loop_worker.py")]
    procs = {"scheduler": subprocess.Popen(BPSLAUNCH, env=_env("scheduler", port)),
             "server": subprocess.Popen(BPSLAUNCH, env=_env("server", port))}
    workers = [subprocess.Popen(BPSLAUNCH + ["--"] + loop, env=_env("worker", port, DMLC_WORKER_ID=i),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    procs["worker"] = workers[1]
    try:
        lines = []
        for w in workers:
            while True:
                line = w.stdout.readline()
                assert line, "".join(lines)
                lines.append(line)
                if "READY" in line:
                    break
        target = procs[victim]
        if victim == "worker":  # bpslaunch's child is the worker process itself: kill that one
            target_pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(target.pid)], capture_output=True,
                                                          text=True).stdout.split()] or [target.pid]
        else:
            target_pids = [target.pid]
        t0 = time.monotonic()
        for pid in target_pids:
            os.kill(pid, signal.SIGKILL)
        out = workers[0].communicate(timeout=30)[0]
        took = time.monotonic() - t0
    finally:
        for p in list(procs.values()) + workers:
            if p.poll() is None:
                p.kill()
    m = re.search(r"LIVENESS-ERROR after [\d.]+s: (.*)", out)
    assert m, out[-2000:]
    print(f"{victim} SIGKILLed: the other worker raised after {took:.2f}s: {m.group(1)}")
    assert named in m.group(1), m.group(1)
    assert took < 4, f"reported after {took:.1f}s"  # detection within 2 s, plus the process's own exit


def test_a_role_whose_exit_blocks_after_sigterm_is_ended_within_the_grace():
    """SIGTERM makes a scheduler or server exit cleanly, but an exit that blocks (a finalizer waiting forever,
    as pyzmq's zero-copy garbage collector once did) must not keep it alive after its launcher: the kernel
    ends it EXIT_GRACE_S later (SIGALRM)."""
    from pushpull.launch.role import EXIT_GRACE_S

    code = ("import atexit, os, signal, time\n"
            "from pushpull.launch.role import exit_on_sigterm\n"
            "signal.signal(signal.SIGTERM, exit_on_sigterm)\n"
            "atexit.register(lambda: time.sleep(120))  # an exit that never ends by itself\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=EXIT_GRACE_S + 10)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert code == -signal.SIGALRM and EXIT_GRACE_S - 1 < took < EXIT_GRACE_S + 5, (code, took)
