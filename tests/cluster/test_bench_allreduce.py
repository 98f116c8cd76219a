"""End-to-end run of ``pushpull bench allreduce`` at its smallest size (2 workers,
1 server, one timed round): the launcher, push_pull, gloo and the raw zmq echo in
one job, and the JSON contract the issue names. No timing goal is asserted here
(those are the benchmark's printed ratios); the figures must only be consistent.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_allreduce_bench_json_contract():
    from pushpull.bench.allreduce import resnet50_sizes

    r = subprocess.run([sys.executable, "-m", "pushpull", "bench", "allreduce", "--workers", "2", "--servers", "1",
                        "--repeat", "1", "--json"], capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert "fraction of ceiling" in r.stdout
    d = json.loads(lines[-1])
    sizes = resnet50_sizes()
    assert (d["workers"], d["servers"], d["tensors"], d["bytes"]) == (2, 1, len(sizes), 4 * sum(sizes))
    for k in ("pushpull_s", "allreduce_s", "zmq_ceiling_GBps", "zmq_hot_buffer_ceiling_GBps"):
        assert d[k] > 0, k
    assert math.isclose(d["ratio_vs_allreduce"], d["allreduce_s"] / d["pushpull_s"])
    rate = 2 * d["workers"] * d["bytes"] / d["pushpull_s"]
    assert math.isclose(d["pushpull_rate_GBps"], rate / 1e9)
    assert math.isclose(d["fraction_of_zmq_ceiling"], d["pushpull_rate_GBps"] / d["zmq_ceiling_GBps"])
    assert math.isclose(d["fraction_of_hot_buffer_ceiling"],
                        d["pushpull_rate_GBps"] / d["zmq_hot_buffer_ceiling_GBps"])
    assert len(d["pushpull_times"]) == len(d["allreduce_times"]) == len(d["zmq_times"]) == 1
    assert d["transport"] == "ipc" and "the same bytes, over ipc" in r.stdout  # the ceiling's transport is push_pull's
    # servers on this host: large keys' payloads through shared memory, bounded by memory (printed beside)
    assert d["shared_memory"] and "payloads via shared memory" in r.stdout
    bound = 2 * d["workers"] * d["bytes"] / (d["memcpy_GBps"] * 1e9 * d["cores"])
    assert math.isclose(d["memory_bound_s"], bound) and math.isclose(d["fraction_of_memory_bound"],
                                                                     bound / d["pushpull_s"])


@pytest.mark.timeout(120)
def test_latency_bench_json_contract():
    """``pushpull bench latency`` end to end at a few calls: push_pull, gloo and the zmq ping in one job,
    the printed lines and a consistent JSON object (no timing goal asserted)."""
    r = subprocess.run([sys.executable, "-m", "pushpull", "bench", "latency", "--iters", "40", "--blocks", "2",
                        "--json"], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "ratio pushpull / gloo" in r.stdout and "raw pyzmq round trip" in r.stdout
    assert "relay of 3 processes" in r.stdout
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert (d["workers"], d["servers"], d["calls"]) == (2, 1, 40)
    for k in ("pushpull_median_us", "pushpull_p99_us", "allreduce_median_us", "allreduce_p99_us",
              "zmq_roundtrip_median_us", "relay_median_us", "relay_p99_us"):
        assert d[k] > 0, k
    assert d["relay_p99_us"] >= d["relay_median_us"]
    assert math.isclose(d["allreduce_p99_over_median"], d["allreduce_p99_us"] / d["allreduce_median_us"])
    assert d["pushpull_p99_us"] >= d["pushpull_median_us"] and d["allreduce_p99_us"] >= d["allreduce_median_us"]
    assert math.isclose(d["ratio_vs_allreduce"], d["pushpull_median_us"] / d["allreduce_median_us"])
    assert math.isclose(d["p99_over_median"], d["pushpull_p99_us"] / d["pushpull_median_us"])


@pytest.mark.timeout(180)
def test_probe_bench_rows(tmp_path):
    """``pushpull bench probe`` end to end at a few calls: one job per backend on this machine, the
    printed simulator settings, and one JSON line per backend whose settings are the mapping of its two
    timings (no timing goal asserted)."""
    from pushpull.sim.config import per_call_costs

    out = tmp_path / "probe.jsonl"
    r = subprocess.run([sys.executable, "-m", "pushpull", "bench", "probe", "--workers", "2", "--servers", "1",
                        "--reps", "5", "--out", str(out)], capture_output=True, text=True, timeout=160, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pushpull sim --backend ps --message-s" in r.stdout
    assert "pushpull sim --backend allreduce --message-s" in r.stdout
    assert "gloo      one 4 KB all_reduce" in r.stdout  # the peer, printed beside the all-reduce backend
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [(d["backend"], d["workers"], d["servers"]) for d in rows] == [("ps", 2, 1), ("allreduce", 2, 1)]
    assert rows[1]["gloo_small_s"] > 0 and rows[1]["gloo_stream_s"] > 0
    for d in rows:
        assert d["t_small_s"] > 0 and d["t_stream_s"] > 0
        lat, msg = per_call_costs(d["backend"], 2, d["t_small_s"], d["t_stream_s"])
        assert (d["latency_s"], d["message_s"]) == (pytest.approx(lat), pytest.approx(msg))
