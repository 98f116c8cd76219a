"""Plain torchrun (no DMLC_* roles): the job starts its own scheduler and servers and trains."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import procs

ROOT = Path(__file__).resolve().parents[2]


def _roles(tag: str) -> int:
    """This test's schedulers and servers: their environment carries its tag (other jobs on this machine, a
    benchmark or a second test session, start roles of their own)."""
    return len(procs.roles(f"PUSHPULL_TEST_TAG={tag}\0".encode()))


def test_plain_torchrun_trains_the_example_and_leaves_nothing():
    tag = f"torchrun-{os.getpid()}-{time.monotonic_ns()}"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(ROOT / "examples" / "train_digits.py"), "--min-accuracy", "0.95", "--no-progress"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={**os.environ, "PUSHPULL_TEST_TAG": tag})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    final = re.search(r"final: test_accuracy=([\d.]+).*workers=(\d)", out)
    assert final and float(final.group(1)) >= 0.95 and final.group(2) == "2", out[-3000:]
    deadline = time.monotonic() + 10
    while _roles(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _roles(tag) == 0, "scheduler or server left running after torchrun returned"


def _agent(name: str, port: int, folder: Path, lines: list) -> subprocess.Popen:
    """One torchrun agent (a 'node' of its own, with its own PUSHPULL_ELASTIC_DIR) of an elastic 1:2 job; A serves
    the rendezvous store."""
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the store the agents share (torch's default), a node that joins
    # in a later round waits for the store's address, which the leading agent publishes only once (docs/elastic.md)
    env = {**os.environ, "NODE_NAME": name, "PUSHPULL_ELASTIC_DIR": str(folder / name), "OMP_NUM_THREADS": "1",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "pushpull-elastic",
         "--max-restarts", "3", "--monitor-interval", "0.5",
         # A serves the rendezvous store (B's loss must not take it); a round waits 8 s for a second node
         # (a keep-alive late by 10 s on a busy machine takes a live node for dead)
        "--rdzv-conf", f"is_host={int(name == 'A')},last_call_timeout=8,keep_alive_interval=1,"
                        f"keep_alive_max_attempt=10",
         str(ROOT / "tests" / "scripts" / "torchrun_elastic_worker.py")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    threading.Thread(target=lambda: [lines.append(f"[{name}] {ln}") for ln in proc.stdout], daemon=True).start()
    return proc


def _wait_for(lines: list, pattern: str, procs: list, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ln in list(lines):
            m = re.search(pattern, ln)
            if m:
                return m
        time.sleep(0.1)
    for p in procs:
        p.kill()
    raise AssertionError(f"no line matching {pattern!r} within {timeout:g}s:\n" + "".join(lines[-60:]))


def test_torchrun_nnodes_min_max_resumes_every_restart_from_the_newest_commit_a_node_kept(tmp_path):
    """Issue 30 item 1 under torchrun --nnodes 1:2: a node lost (its agent SIGKILLed), then a new node joining;
    torchrun restarts every worker each time, and elastic.run resumes from the newest commit a node kept, so the
    epochs go on, not over (tests/scripts/torchrun_elastic_worker.py)."""
    from pushpull.launch.torchrun import _free_port

    port, lines = _free_port("127.0.0.1"), []
    a = _agent("A", port, tmp_path, lines)
    procs = [a]
    try:
        procs.append(_agent("B", port, tmp_path, lines))
        _wait_for(lines, r"VICTIM node B", procs, 120)
        alone = _wait_for(lines, r"\[A\] RESUMED node A epoch (\d+) commits \d+ rank 0 size 1", procs, 120)
        procs.append(_agent("C", port, tmp_path, lines))
        again = _wait_for(lines, r"\[C\] RESUMED node C epoch (\d+) commits \d+ rank \d size 2", procs, 120)
        a.wait(timeout=120)
        procs[2].wait(timeout=120)
    finally:  # the agents, and their workers (each in a session of its own); the roles die with the workers
        for pid in re.findall(r"START node \w pid (\d+)", "".join(lines)):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.kill()
    b, c = procs[1], procs[2]
    out = "".join(lines)
    assert a.returncode == 0 and c.returncode == 0, out[-4000:]
    assert b.returncode != 0, out[-4000:]
    # A resumed alone from its node's commit of before the loss (epoch 3 was being trained); C resumed beside it
    # from A's node, no earlier than where A alone had started
    assert int(alone.group(1)) >= 3 and int(again.group(1)) >= int(alone.group(1)), out[-4000:]
    finals = re.findall(r"FINAL node ([AC]) rank \d size 2 epoch 12 sizes (\[[\d, ]+\])", out)
    assert sorted(n for n, _ in finals) == ["A", "C"] and finals[0][1] == finals[1][1], out[-4000:]
    sizes = [int(v) for v in finals[0][1].strip("[]").split(",")]
    # the epochs' sizes, kept across restarts: two nodes, then one, then two again
    assert sizes == [2, 2, 2, 1, 1] + [2] * 7, sizes  # (A alone trains two epochs, then waits for C)
