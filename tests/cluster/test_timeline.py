"""The live timeline (PUSHPULL_TRACE_ON) of real jobs and ``pushpull timeline summarize``; the pieces in
one process: tests/unit/test_timeline.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pushpull import timeline_cli as tl
from pushpull.timeline import load_trace

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "trace_worker.py")


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update({k: str(v) for k, v in kw.items()})
    return env


def X(tid, name, cat, ts, dur, **args):
    return {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_summarize_hand_made_trace(tmp_path):
    ev = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "worker 0"}},
        # step 0: forward/backward 0..100, synchronize 100..200, update 200..220
        X(1, "step 0", "step", 0, 220, step=0),
        X(2, "forward/backward", "compute", 0, 100),
        X(2, "synchronize", "wait", 100, 100),
        X(2, "update", "compute", 200, 20),
        X(3, "queue", "queue", 40, 10),
        X(3, "push", "comm", 50, 100),       # comm 50..150
        X(3, "pull", "comm", 150, 60),       # comm 150..210
        X(4, "push", "comm", 60, 60),        # inside the first: counted once
        X(4, "compress", "codec", 55, 5),    # not communication
        # step 1: 220..320, all compute, comm 300..340 crosses into the next (untraced) time
        X(1, "step 1", "step", 220, 100, step=1),
        X(2, "compute", "compute", 220, 100),
        X(3, "push", "comm", 300, 40),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    procs = tl.summarize(tl.load_trace(path)[0])
    assert len(procs) == 1 and procs[0]["name"] == "worker 0"
    s0, s1 = procs[0]["steps"]
    # compute = [0,100] + [200,220]; comm = [50,210]; overlap = [50,100] + [200,210]
    assert s0 == {"step": 0, "time_ms": 0.22, "compute_ms": 0.12, "comm_ms": 0.16, "overlap_ms": 0.06,
                  "exposed_comm_ms": 0.1, "overlap_pct": 37.5}
    # comm clipped to the step: [300,320]
    assert (s1["compute_ms"], s1["comm_ms"], s1["overlap_ms"], s1["exposed_comm_ms"]) == (0.1, 0.02, 0.02, 0.0)
    out = subprocess.run([sys.executable, "-m", "pushpull", "timeline", "summarize", str(path)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "overlap" in out.stdout and "mean" in out.stdout
    lines = [ln.split() for ln in out.stdout.splitlines()]
    assert ["0", "0.2", "0.1", "0.2", "0.1", "0.1", "37.5"] in lines


def _check_partitions(events: list[dict]) -> int:
    """Per partition and round: queue <= [compress] <= push <= pull <= [decompress], no overlap."""
    order = {"queue": 0, "compress": 1, "push": 2, "pull": 3, "decompress": 4}
    groups: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] in order:
            groups.setdefault((e["tid"], e["args"]["key"], e["args"]["round"]), []).append(e)
    for key, evs in groups.items():
        evs.sort(key=lambda e: order[e["name"]])
        names = [e["name"] for e in evs]
        assert names[0] == "queue" and "push" in names and "pull" in names, (key, names)
        assert len(set(names)) == len(names), (key, names)
        for a, b in zip(evs, evs[1:]):
            assert a["dur"] >= 0
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (key, a, b)
    return len(groups)


def test_two_worker_job_writes_valid_consistent_timelines(tmp_path):
    d = tmp_path / "trace"
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "2", "--",
            sys.executable, WORKER, "--steps", "6"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=_env(BYTEPS_TRACE_ON=1, BYTEPS_TRACE_START_STEP=2, BYTEPS_TRACE_END_STEP=4,
                                  BYTEPS_TRACE_DIR=d, BYTEPS_PARTITION_BYTES=40000, BYTEPS_SCHEDULING_CREDIT=2))
    out = res.stdout + res.stderr
    assert res.returncode == 0 and out.count("ALL-OK") == 2, out[-3000:]
    for rank in (0, 1):
        path = d / str(rank) / "timeline.json"
        doc = json.loads(path.read_text())
        ev = doc["traceEvents"]
        assert doc["otherData"]["rank"] == rank
        assert {e["pid"] for e in ev} == {rank}
        tracks = {e["args"]["name"] for e in ev if e["name"] == "thread_name"}
        # gradients' tracks carry their name space on the servers (Gradient.<parameter>, as BytePS names them)
        assert {"step", "compute", "wait", "Gradient.0.weight", "Gradient.0.weight#0", "Gradient.2.weight#1",
                "Gradient.4.bias"} <= tracks, tracks
        steps = sorted(e["args"]["step"] for e in ev if e.get("cat") == "step")
        assert steps == [2, 3, 4]
        # 6 tensors, 0.weight in 2 and 2.weight in 7 partitions: 13 partitions a step, 3 steps
        assert _check_partitions(ev) >= 13 * 2
        assert sum(e["name"] == "push_pull" for e in ev) >= 6 * 2
        procs = tl.summarize(ev)
        rows = procs[0]["steps"]
        assert [r["step"] for r in rows] == [2, 3, 4]
        for r in rows:
            assert r["comm_ms"] > 0 and r["compute_ms"] > 0
            assert r["overlap_ms"] <= min(r["compute_ms"], r["comm_ms"]) + 1e-3
            assert r["compute_ms"] <= r["time_ms"] + 1e-3 and r["comm_ms"] <= r["time_ms"] + 1e-3
            assert abs(r["exposed_comm_ms"] - (r["comm_ms"] - r["overlap_ms"])) < 2e-3
    js = subprocess.run([sys.executable, "-m", "pushpull", "timeline", "summarize", "--json",
                         str(d / "0" / "timeline.json")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert js.returncode == 0, js.stderr
    assert [r["step"] for r in json.loads(js.stdout)["processes"][0]["steps"]] == [2, 3, 4]
    merged = tmp_path / "all.json"
    assert tl.main(["merge", str(d), "-o", str(merged)]) == 0
    assert {e["pid"] for e in json.loads(merged.read_text())["traceEvents"]} == {0, 1, 1_000_000, 1_000_001}


def test_server_timeline_has_every_workers_push_and_the_round(tmp_path):
    """The servers' side (PUSHPULL_TRACE_ON on servers): per key, one push per worker, then the round."""
    d = tmp_path / "trace"
    res = subprocess.run([sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "2", "--",
                          sys.executable, WORKER, "--steps", "6"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=_env(PUSHPULL_TRACE_ON=1, PUSHPULL_TRACE_DIR=d, PUSHPULL_TRACE_START_STEP=2,
                                            PUSHPULL_TRACE_END_STEP=4, BYTEPS_PARTITION_BYTES=40000))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    for srv in ("server0", "server1"):
        ev, meta = load_trace(d / srv / "timeline.json")
        assert meta["first_round"] == 2 and meta["last_round"] == 5
        rounds = [e for e in ev if e.get("cat") == "round"]
        pushes = [e for e in ev if e.get("cat") == "push"]
        assert rounds, f"{srv}: no round completed in the traced window"
        for r in rounds:
            a = r["args"]
            ranks = {p["args"]["rank"] for p in pushes if p["args"]["key"] == a["key"]
                     and p["args"]["round"] == a["round"]}
            assert ranks == {0, 1}, (srv, a)
            assert 2 <= a["round"] <= 5 and r["dur"] >= 0


def test_timeline_is_valid_json_after_sigterm(tmp_path):
    d = tmp_path / "trace"
    res = subprocess.run([sys.executable, WORKER, "--steps", "20", "--sigterm-at", "5", "--explicit-steps"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=_env(PUSHPULL_TRACE_ON=1, PUSHPULL_TRACE_START_STEP=1, PUSHPULL_TRACE_END_STEP=50,
                                  PUSHPULL_TRACE_DIR=d))
    assert res.returncode == -15, res.stdout + res.stderr
    ev = json.loads((d / "0" / "timeline.json").read_text())["traceEvents"]
    assert sorted(e["args"]["step"] for e in ev if e.get("cat") == "step") == [1, 2, 3, 4]


def test_tracing_off_writes_nothing(tmp_path):
    res = subprocess.run([sys.executable, WORKER, "--steps", "2"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=_env())
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (tmp_path / "trace").exists()
