"""Tests of pushpull.sim: closed forms, strategy semantics, scale, CLI.

All profiles are synthetic and built here, so the tests do not depend on
the shipped profile files.
"""
from __future__ import annotations

import json
import math
import time

import pytest

from pushpull.profiles import Profile
from pushpull.sim import (BSP, MGWFBP, WFBP, ByteScheduler, ClusterConfig, Compression, Fusion, mgwfbp_merge,
                          parse_bandwidth, parse_bytes, parse_duration, simulate, synthetic_profile,
                          transformer_like, validate)
from pushpull.sim.cli import plan_main, sim_main
from pushpull.timeline import load_events

B = 1.25e9            # 10 Gbit/s in bytes/s
ALL = ["bsp", "wfbp", "fusion", "mgwfbp", "bytescheduler"]


def many_small(n_tensors=1000, numel=25_000, fwd=0.0):
    """100 MB in 1000 tensors of 100 KB: fine-grained enough that pipeline
    fill and drain are ~0.1-1 % of the total."""
    return synthetic_profile([numel] * n_tensors, fwd_s=fwd)


# ---------------------------------------------------------------------------
# units and argument errors
# ---------------------------------------------------------------------------

def test_parse_units():
    assert parse_bandwidth("10gbit") == pytest.approx(1.25e9)
    assert parse_bandwidth("100mbit") == pytest.approx(12.5e6)
    assert parse_bandwidth("25Gbps") == pytest.approx(25e9 / 8)
    assert parse_bandwidth("1.25GB/s") == pytest.approx(1.25e9)
    assert math.isinf(parse_bandwidth("inf"))
    assert parse_duration("50us") == pytest.approx(50e-6)
    assert parse_duration("1ms") == pytest.approx(1e-3)
    assert parse_bytes("4MB") == 4_000_000
    assert parse_bytes("64MiB") == 64 * 1024 ** 2
    for bad in ("ten gbit", "10GB", "10 furlongs", "-1gbit", "0gbit"):
        with pytest.raises(ValueError, match="bandwidth"):
            parse_bandwidth(bad)
    with pytest.raises(ValueError, match="latency"):
        parse_duration("fast")


def test_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="workers"):
        ClusterConfig(workers=0, bandwidth=B)
    with pytest.raises(ValueError, match="backend"):
        ClusterConfig(workers=2, bandwidth=B, backend="mpi")
    with pytest.raises(ValueError, match="servers"):
        ClusterConfig(workers=2, servers=3, bandwidth=B, colocated=True)
    with pytest.raises(ValueError, match="strategy"):
        simulate(many_small(4), ClusterConfig(workers=2, bandwidth=B), "magic")
    with pytest.raises(ValueError, match="partition_bytes"):
        ByteScheduler(partition_bytes=0)


# ---------------------------------------------------------------------------
# closed forms (ring all-reduce 2(n-1)/n M/B; PS max(M/B, nM/(kB)), as in the BytePS paper)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 8])
def test_ps_k_equals_n_gives_M_over_B(n):
    # zero compute, k = n servers: each worker sends M and receives M on its
    # own full-duplex NIC, each server receives n * M/k = M: time -> M/B
    # (+ one push and one pull latency for the last tensor)
    prof = many_small()
    M = prof.nbytes
    lat = 50e-6
    r = simulate(prof, ClusterConfig(workers=n, servers=n, bandwidth=B, latency=lat), "wfbp")
    expected = M / B + 2 * lat
    assert abs(r.iteration_s - expected) / expected < 0.01
    assert r.compute_s == 0


def test_ps_fewer_servers_is_server_bound():
    # k < n: the servers' NICs carry n*M/k, the bound max(M/B, n*M/(k*B))
    prof = many_small()
    M = prof.nbytes
    r = simulate(prof, ClusterConfig(workers=8, servers=2, bandwidth=B, latency=0), "wfbp")
    assert r.iteration_s == pytest.approx(8 * M / (2 * B), rel=0.01)


def test_ps_colocated_matches_allreduce_volume():
    # BytePS layout, k = n colocated: each NIC carries (n-1)/n*M of pushes and
    # (n-1)/n*M of pull answers: 2(n-1)/n * M/B, the all-reduce volume
    prof = many_small()
    M, n = prof.nbytes, 4
    r = simulate(prof, ClusterConfig(workers=n, servers=n, bandwidth=B, latency=0, colocated=True), "wfbp")
    assert r.iteration_s == pytest.approx(2 * (n - 1) / n * M / B, rel=0.01)


def test_flat_path_with_several_processes_per_machine_moves_local_size_copies():
    # 2 machines x 2 processes, servers colocated: with the local reduce each NIC carries M/2 of pushes and
    # M/2 of pull answers (one endpoint per machine); without it each of the 2 processes pushes everything
    prof = many_small()
    M = prof.nbytes
    hier = simulate(prof, ClusterConfig(workers=2, servers=2, bandwidth=B, latency=0, colocated=True, local_size=2),
                    "wfbp")
    flat = simulate(prof, ClusterConfig(workers=2, servers=2, bandwidth=B, latency=0, colocated=True, local_size=2,
                                        local_reduce=False), "wfbp")
    assert hier.iteration_s == pytest.approx(M / B, rel=0.01)
    assert flat.iteration_s == pytest.approx(2 * M / B, rel=0.01)
    assert flat.throughput == pytest.approx(hier.throughput / 2, rel=0.01)  # 4 replicas either way


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_ring_allreduce_closed_form(n):
    # 2(n-1) steps of M/n, each alpha + (M/n)/B
    prof = many_small()
    M, lat = prof.nbytes, 50e-6
    r = simulate(prof, ClusterConfig(workers=n, bandwidth=B, latency=lat, backend="allreduce"), "bsp")
    expected = 2 * (n - 1) / n * M / B + 2 * (n - 1) * lat
    assert abs(r.iteration_s - expected) / expected < 0.01


@pytest.mark.parametrize("backend", ["ps", "allreduce"])
@pytest.mark.parametrize("strategy", ALL)
def test_infinite_bandwidth_iteration_is_compute(backend, strategy):
    prof = transformer_like(n_layers=4, hidden=256, vocab=1000, seq=128, compute_s=0.1)
    cl = ClusterConfig(workers=8, servers=2, bandwidth=math.inf, latency=0.0, backend=backend)
    kw = {"cycle_s": 0.0} if strategy == "fusion" else {}
    s = Fusion(**kw) if strategy == "fusion" else strategy
    r = simulate(prof, cl, s)
    assert r.iteration_s == pytest.approx(prof.compute_s, rel=1e-9)
    assert r.exposed_comm_s == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("backend", ["ps", "allreduce"])
def test_bsp_nothing_overlaps(backend):
    prof = synthetic_profile([3_000_000, 500_000, 8_000_000, 20_000], fwd_s=[0.01, 0.004, 0.02, 0.001])
    cl = ClusterConfig(workers=8, servers=4, bandwidth=B, latency=50e-6, backend=backend)
    comm = simulate(prof, cl, BSP(), compute_scale=0.0).iteration_s
    r = simulate(prof, cl, BSP())
    assert comm > 0
    assert r.iteration_s == pytest.approx(prof.compute_s + comm, rel=1e-9)
    assert r.exposed_comm_s == pytest.approx(comm, rel=1e-9)
    # and overlapping strategies are never worse than bsp here
    assert simulate(prof, cl, WFBP()).iteration_s <= r.iteration_s + 1e-12


def test_layerwise_update_helps_and_steady_state_is_periodic(tmp_path):
    # with priorities the input layer comes back first; layer-wise updates let
    # its forward start while later layers are still in flight
    prof = synthetic_profile([10_000_000] * 6, fwd_s=0.01)
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B)
    s = ByteScheduler(partition_bytes=1_000_000, credit_bytes=8_000_000)
    on = simulate(prof, cl, s)
    off = simulate(prof, cl, s, layerwise_update=False)
    assert on.iteration_s < off.iteration_s
    # in the trace, backwards start exactly one iteration apart
    ev = load_events(on.write_trace(tmp_path / "t.json"))
    starts = sorted(e["ts"] for e in ev if e.get("name") == "bwd l5")
    assert len(starts) == on.iterations
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(g == pytest.approx(on.iteration_s * 1e6, abs=0.01) for g in gaps)


# ---------------------------------------------------------------------------
# MG-WFBP by hand
# ---------------------------------------------------------------------------

def test_mgwfbp_merge_hand_worked():
    # Units: ms and bytes. alpha = 1 ms, beta = 1 ms per MB, so a message of
    # x MB costs 1 + x ms. Small threshold = 8192 elements * 4 B = 32768 B.
    #
    # layer (forward order)     0      1     2     3     4     5
    # bwd time (ms)            10      7    0.5    1     3     2
    # size (MB)               0.01     4     2     1     2     3
    # ready = suffix sum of bwd (backward runs 5 -> 0):
    #   ready5 = 2, ready4 = 5, ready3 = 6, ready2 = 6.5, ready1 = 13.5, ready0 = 23.5
    #
    # G = [5] (3 MB). Candidate 4: start = max(ready5=2, prev_end=0) = 2,
    #   finish = 2 + 1 + 3 = 6; ready4 = 5 < 6 but the wait 5 - 2 = 3 >= alpha
    #   -> close [5] (ends at 6); G = [4] (2 MB).
    # Candidate 3: start = max(ready4=5, 6) = 6 (the network is still busy),
    #   finish = 6 + 1 + 2 = 9; ready3 = 6 -> wait 0: it would wait anyway
    #   -> merge, G = [4, 3] (3 MB).
    # Candidate 2: start = max(ready3=6, 6) = 6, finish = 6 + 1 + 3 = 10;
    #   ready2 = 6.5 -> wait 0.5 < alpha -> merge, G = [4, 3, 2] (5 MB).
    # Candidate 1: start = max(ready2=6.5, 6) = 6.5, finish = 6.5 + 1 + 5 = 12.5;
    #   ready1 = 13.5 >= 12.5: ready only after G would finish
    #   -> close [4, 3, 2] (ends at 12.5); G = [1] (4 MB).
    # Candidate 0: start = max(13.5, 12.5) = 13.5, finish = 18.5; ready0 = 23.5
    #   is too late by timing, but layer 0 is 10 KB < 32768 B -> always merged.
    # Result: [[5], [4, 3, 2], [1, 0]]
    bwd = [10, 7, 0.5, 1, 3, 2]
    sizes = [1e4, 4e6, 2e6, 1e6, 2e6, 3e6]
    assert mgwfbp_merge(bwd, sizes, alpha=1.0, beta=1e-6) == [[5], [4, 3, 2], [1, 0]]
    # With alpha = 0 there is nothing to save, only the "wait anyway" and the
    # small-tensor rules merge:
    #   [5]: start 2, finish 2 + 3 = 5; ready4 = 5 is not before 5 -> close.
    #   [4]: start max(5, 5) = 5, finish 7; ready3 = 6, wait 1 > 0 -> close.
    #   [3]: start max(6, 7) = 7, finish 8; ready2 = 6.5 <= 7 (waits anyway) -> merge.
    #   [3, 2]: start 7, finish 10; ready1 = 13.5 -> close.  [1] + tiny 0 -> merge.
    assert mgwfbp_merge(bwd, sizes, alpha=0.0, beta=1e-6) == [[5], [4], [3, 2], [1, 0]]
    # a huge alpha merges everything that is ready before the message would finish
    assert mgwfbp_merge(bwd, sizes, alpha=100.0, beta=1e-6) == [[5, 4, 3, 2, 1, 0]]


def test_mgwfbp_tasks_follow_groups():
    prof = synthetic_profile([100, 2_000_000, 50, 3_000_000], fwd_s=0.001)
    cl = ClusterConfig(workers=4, bandwidth=B, backend="allreduce")
    r = simulate(prof, cl, MGWFBP())
    assert r.n_tasks < 4   # the two tiny layers were merged


# ---------------------------------------------------------------------------
# ByteScheduler: priority beats FIFO; credit bound holds
# ---------------------------------------------------------------------------

def _comm_bound_profile():
    # three 40 MB layers, 20 ms forward and 20 ms backward each: each layer's
    # gradient needs ~32 ms on 10 Gbit/s, so WFBP's order (output layer first)
    # leaves the input layer's update for last and the next forward waits
    return synthetic_profile([10_000_000] * 3, fwd_s=0.02, bwd_s=0.02)


@pytest.mark.parametrize("backend", ["ps", "allreduce"])
def test_bytescheduler_beats_wfbp(backend):
    prof = _comm_bound_profile()
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B, latency=50e-6, backend=backend)
    wfbp = simulate(prof, cl, "wfbp")
    # all-reduce pays 2(n-1) latencies per collective: larger partitions there
    part = 1_000_000 if backend == "ps" else 8_000_000
    bs = simulate(prof, cl, ByteScheduler(partition_bytes=part, credit_bytes=8_000_000))
    assert bs.iteration_s < 0.9 * wfbp.iteration_s
    # the input layer's update is what moved: it comes back earlier
    assert bs.layer_update_s[0] < wfbp.layer_update_s[0]


def test_bytescheduler_credit_bound_and_overtaking_in_trace(tmp_path):
    prof = _comm_bound_profile()
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B, latency=50e-6)
    part, credit = 1_000_000, 8_000_000
    r = simulate(prof, cl, ByteScheduler(partition_bytes=part, credit_bytes=credit))
    ev = [e for e in load_events(r.write_trace(tmp_path / "bs.json"))
          if e.get("ph") == "X" and e["args"].get("iteration") == 0]
    comm = [e for e in ev if e["name"] == "comm"]
    assert len(comm) == 120
    # over PS the credit comes back with the push acknowledgement, before the pull
    held = [e for e in ev if e["name"] == "credit"]
    assert len(held) == 120
    assert all(h["dur"] < c["dur"] for h, c in zip(sorted(held, key=lambda e: e["tid"]),
                                                    sorted(comm, key=lambda e: e["tid"])))
    eps = 0.01  # us; timestamps are rounded to 1 ns
    max_inflight = 0
    for a in held:
        # bytes admitted before a (admission order) whose credit was not back when a was admitted
        t = a["ts"]
        before = sum(e["args"]["bytes"] for e in held
                     if e["args"]["admit_order"] < a["args"]["admit_order"] and e["ts"] + e["dur"] > t + eps)
        assert before < credit, f"admitted {a['args']} with {before} bytes in flight"
        max_inflight = max(max_inflight, before + a["args"]["bytes"])
    assert credit <= max_inflight < credit + part
    # a partition of layer 0 released late overtakes queued partitions of layer 2
    queue = {e["tid"]: e for e in ev if e["name"] == "queue"}
    names = {e["tid"]: e for e in comm}
    lay = lambda tid: int(names[tid]["args"]["priority"][0])
    overtakes = [(a, b) for a in queue for b in queue
                 if lay(a) == 0 and lay(b) == 2
                 and queue[b]["ts"] < queue[a]["ts"]                                   # b released first
                 and queue[a]["ts"] + queue[a]["dur"] < queue[b]["ts"] + queue[b]["dur"]]  # a admitted first
    assert overtakes


def test_fusion_threshold_and_cycle():
    prof = synthetic_profile([[1_000_000, 1_000_000]] * 4, fwd_s=0.0, bwd_s=0.0)   # 8 x 4 MB, all at t=0
    cl = ClusterConfig(workers=2, bandwidth=B, backend="allreduce", latency=0)
    r = simulate(prof, cl, Fusion(threshold_bytes=10_000_000, cycle_s=1e-3))
    assert r.n_tasks == 4   # 8 tensors of 4 MB in 10 MB buffers -> 2 per buffer
    # with a 1 ms cycle nothing is sent before the first tick
    assert min(u for u in r.layer_update_s) >= 1e-3


def test_compression_cuts_communication():
    prof = many_small(100, 250_000)
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B, latency=0)
    plain = simulate(prof, cl, WFBP())
    comp = simulate(prof, cl, WFBP(compression=Compression(ratio=4)))
    assert comp.iteration_s == pytest.approx(plain.iteration_s / 4, rel=0.02)
    slow = simulate(prof, cl, WFBP(compression=Compression(ratio=4, compress_s_per_byte=1e-9,
                                                          decompress_s_per_byte=1e-9)))
    assert slow.iteration_s > comp.iteration_s


# ---------------------------------------------------------------------------
# scale
# ---------------------------------------------------------------------------

def test_bert_large_64x16_under_5s():
    prof = transformer_like()          # ~335M parameters, ~390 tensors
    assert 300e6 < prof.numel < 360e6
    assert 350 <= sum(1 for _ in prof.tensors()) <= 450
    cl = ClusterConfig(workers=64, servers=16, bandwidth=parse_bandwidth("10gbit"))
    for s in ("wfbp", ByteScheduler(partition_bytes=1_000_000, credit_bytes=math.inf)):
        t0 = time.perf_counter()
        r = simulate(prof, cl, s)
        elapsed = time.perf_counter() - t0
        assert elapsed < 5.0, f"{r.strategy}: {elapsed:.2f} s"
        # 64 workers on 16 servers: server-bound, n*M/(k*B) = 4 M/B
        assert r.comm_span_s >= 4 * prof.nbytes / cl.bandwidth * 0.99


def test_shipped_bert_large_64x16_under_5s():
    from pushpull.profiles import builtin_names, load_profile
    if "bert_large" not in builtin_names():
        pytest.skip("shipped bert_large profile not present")
    prof = load_profile("bert_large")
    cl = ClusterConfig(workers=64, servers=16, bandwidth=parse_bandwidth("10gbit"))
    t0 = time.perf_counter()
    for s in ALL:
        simulate(prof, cl, s)
    assert time.perf_counter() - t0 < 5.0


# ---------------------------------------------------------------------------
# CLI and validation
# ---------------------------------------------------------------------------

@pytest.fixture
def profile_path(tmp_path):
    p = tmp_path / "toy.json"
    synthetic_profile([2_000_000, 100_000, 6_000_000, 1_000], fwd_s=0.005, model="toy").save(p)
    return p


def test_sim_cli_table_json_sweep(profile_path, tmp_path, capsys):
    assert sim_main(["--profile", str(profile_path), "--workers", "4", "--servers", "2",
                     "--bandwidth", "10gbit", "--latency", "20us"]) == 0
    out = capsys.readouterr().out
    for s in ALL:
        assert s in out
    assert "vs wfbp" in out
    assert sim_main(["--profile", str(profile_path), "--workers", "4", "--bandwidth", "25Gbps",
                     "--backend", "allreduce", "--strategy", "wfbp,bytescheduler", "--json",
                     "--trace", str(tmp_path / "tr.json")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["strategy"].split("(")[0] for r in rows} == {"wfbp", "bytescheduler"}
    assert (tmp_path / "tr.wfbp.json").exists() and (tmp_path / "tr.bytescheduler.json").exists()
    assert sim_main(["--profile", str(profile_path), "--workers", "4", "--bandwidth", "10gbit",
                     "--strategy", "wfbp,bsp", "--sweep", "ratio=0.5,2", "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "compute/comm = 0.5" in out and (tmp_path / "p.png").stat().st_size > 1000


def test_sim_cli_message_s_reaches_the_cluster(profile_path, capsys):
    """--message-s is the per-message CPU stage: BSP's one collective pays it once, before the ring."""
    args = ["--profile", str(profile_path), "--workers", "4", "--bandwidth", "10gbit", "--backend", "allreduce",
            "--strategy", "bsp", "--json"]
    assert sim_main(args) == 0
    free = json.loads(capsys.readouterr().out)[0]
    assert sim_main(args + ["--message-s", "10ms"]) == 0
    charged = json.loads(capsys.readouterr().out)[0]
    assert charged["comm_span_s"] - free["comm_span_s"] == pytest.approx(0.010)


def test_per_call_costs_ps_stream_is_the_stage_the_rest_latency():
    """A user's (or the auto strategy's) two timings of tiny reductions -> the PS cluster's per-message
    stage and latency: the stream's time per reduction is the stage; what one alone takes beyond it is
    latency, over a push and a pull."""
    from pushpull.sim.config import per_call_costs

    assert per_call_costs("ps", 4, 2e-3, 5e-4) == pytest.approx((0.75e-3, 5e-4))


def test_per_call_costs_allreduce_one_call_is_an_order_message_and_a_collective():
    """All-reduce fuses a stream of tiny reductions, so the stream says nothing per collective: one
    reduction alone is rank 0's order message and one collective, priced alike, each 2(n-1) latencies."""
    from pushpull.sim.config import per_call_costs

    assert per_call_costs("allreduce", 4, 6e-3, 5e-4) == pytest.approx((0.5e-3, 0.0))
    assert per_call_costs("allreduce", 4, 6e-3, 9e-3) == pytest.approx((0.5e-3, 0.0))


def test_per_call_costs_a_ps_stream_slower_than_one_call_is_all_stage():
    from pushpull.sim.config import per_call_costs

    lat, msg = per_call_costs("ps", 8, 1e-3, 3e-3)
    assert msg == pytest.approx(1e-3) and lat == pytest.approx(1e-6)


def test_per_call_costs_rejects_a_nan_timing():
    from pushpull.sim.config import per_call_costs

    with pytest.raises(ValueError, match="t_small"):
        per_call_costs("ps", 4, float("nan"), 1e-3)


def test_validation_host_probe_column_adds_only_what_was_probed():
    """benchmarks/validate_sim.py's "+host probe" column: a cell gets the per-call costs probed before
    any run for its backend and number of workers (its path delay stays added to the latency); a cell
    with no such probe stays uncalibrated (and says so)."""
    import importlib.util
    from pathlib import Path

    from pushpull.sim.config import per_call_costs

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "validate_sim.py"
    spec = importlib.util.spec_from_file_location("validate_sim", path)
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    probes = {("allreduce", 4): {"t_small_s": 6e-3, "t_stream_s": 4e-3}}
    row = {"backend": "allreduce", "workers": 4, "delay": "5ms", "latency": 5.05e-3}
    got = vs.with_host_probe(row, probes)
    lat, msg = per_call_costs("allreduce", 4, 6e-3, 4e-3)
    assert got["host_probe"] and got["message_s"] == pytest.approx(msg)
    assert got["latency"] == pytest.approx(5e-3 + lat)
    other = vs.with_host_probe({"backend": "ps", "workers": 4}, probes)
    assert not other["host_probe"] and "message_s" not in other and "latency" not in other


def test_cli_bad_input_names_argument(profile_path, capsys):
    assert sim_main(["--profile", str(profile_path), "--workers", "4", "--bandwidth", "fast"]) == 2
    assert "--bandwidth" in capsys.readouterr().err
    assert sim_main(["--profile", str(profile_path), "--workers", "0", "--bandwidth", "1gbit"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert sim_main(["--profile", "no_such_model", "--workers", "2", "--bandwidth", "1gbit"]) == 2
    assert "--profile" in capsys.readouterr().err
    assert sim_main(["--profile", str(profile_path), "--workers", "2", "--bandwidth", "1gbit",
                     "--strategy", "wfbp,nope"]) == 2
    assert "--strategy" in capsys.readouterr().err
    assert sim_main(["--profile", str(profile_path), "--workers", "2", "--bandwidth", "1gbit",
                     "--sweep", "color=red"]) == 2
    assert "--sweep" in capsys.readouterr().err


def test_plan_cli(profile_path, capsys):
    assert plan_main(["--profile", str(profile_path), "--workers", "4", "--servers", "4",
                      "--bandwidth", "1gbit"]) == 0
    out = capsys.readouterr().out
    assert "recommendation:" in out and "gain over wfbp" in out and "why:" in out
    assert plan_main(["--profile", str(profile_path), "--workers", "4", "--bandwidth", "1gbit",
                      "--backend", "any", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gain_over_wfbp"] >= 1.0 and d["reason"]
    assert d["env"]["PUSHPULL_BACKEND"] == d["backend"] and d["env"]["PUSHPULL_STRATEGY"] == d["strategy"]


def test_plan_env_applies_a_bytescheduler_recommendation():
    """The printed settings are ones the configuration accepts, with the plan's partition and credit."""
    from pushpull.config import load_config
    from pushpull.sim.cli import plan_env

    class _P:  # only what plan_env reads
        cluster = ClusterConfig(workers=4, servers=4, bandwidth=1e9)
        best_strategy = ByteScheduler(partition_bytes=2_000_000, credit_bytes=math.inf)
    env = plan_env(_P())
    cfg = load_config(env)
    assert (cfg.strategy, cfg.backend) == ("bytescheduler", "ps")
    assert cfg.bytescheduler_partition_bytes == 2_000_000
    assert cfg.bytescheduler_credit_bytes >= 1 << 40  # unlimited: larger than any model


def test_validate_table():
    prof = synthetic_profile([2_000_000, 4_000_000], fwd_s=0.01, model="toy")
    cl = dict(backend="ps", workers=4, servers=2, bandwidth="10gbit", compute_scale=1.0)
    pred = {s: simulate(prof, ClusterConfig(workers=4, servers=2, bandwidth=B), s).iteration_s
            for s in ("wfbp", "bsp")}
    rows = [{"model": "toy", "strategy": "wfbp", **cl, "measured_step_s": pred["wfbp"]},
            {"model": "toy", "strategy": "bsp", **cl, "measured_step_s": pred["bsp"] * 2}]
    t = validate(rows, profiles={"toy": prof})
    assert t.rows[0]["error"] == pytest.approx(0, abs=1e-9)
    assert t.rows[1]["error"] == pytest.approx(-0.5, rel=1e-9)
    assert t.median_abs_error == pytest.approx(0.25)
    assert t.worst["strategy"] == "bsp"
    md = t.to_markdown()
    assert "median absolute error 25.0 %" in md and "| toy | bsp |" in md
    with pytest.raises(ValueError, match="measured_step_s"):
        validate([{k: v for k, v in rows[0].items() if k != "measured_step_s"}], profiles={"toy": prof})


def test_profile_is_not_mutated():
    prof = synthetic_profile([1000, 2000], fwd_s=0.01)
    before = prof.to_dict()
    simulate(prof, ClusterConfig(workers=2, bandwidth=B), "mgwfbp", compute_scale=0.5)
    assert prof.to_dict() == before
    assert isinstance(prof, Profile)


# ---------------------------------------------------------------------------
# terms added for the emulated-cluster validation (all off by default)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["ps", "allreduce"])
def test_message_cost_is_a_pipelined_stage(backend):
    # 200 tiny tensors: the per-message stage is the bottleneck, 200 * message_s over PS; the all-reduce
    # backend fuses them (the first alone, the 199 released during its order message in one collective),
    # so it pays the stage twice; one big tensor: the stage overlaps nothing but its own start, so it
    # adds message_s once
    msg = 1e-3
    cl = dict(workers=4, servers=4, bandwidth=B, latency=0.0, backend=backend)
    tiny = synthetic_profile([16] * 200)
    r = simulate(tiny, ClusterConfig(**cl, message_s=msg), "wfbp")
    assert r.iteration_s == pytest.approx((200 if backend == "ps" else 2) * msg, rel=0.01)
    big = synthetic_profile([25_000_000])
    plain = simulate(big, ClusterConfig(**cl, ps_partition_bytes=10**9), "bsp").iteration_s
    with_msg = simulate(big, ClusterConfig(**cl, message_s=msg, ps_partition_bytes=10**9), "bsp").iteration_s
    assert with_msg == pytest.approx(plain + msg, rel=1e-6)


def test_ps_bytescheduler_partition_is_the_key_and_credit_returns_at_push_ack():
    # a 40 MB tensor with whole-tensor partitions goes to ONE server: 4 workers x 40 MB into
    # one NIC, then 4 x 40 MB out of it -- 8 x 40 MB / B -- instead of being sharded over 4
    prof = synthetic_profile([10_000_000])
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B, latency=0.0)
    whole = simulate(prof, cl, ByteScheduler(partition_bytes=10**12, credit_bytes=math.inf))
    assert whole.iteration_s == pytest.approx(8 * 40e6 / B, rel=1e-6)
    sharded = simulate(prof, cl, "wfbp")          # 4 MB keys spread over the 4 servers
    assert sharded.iteration_s < whole.iteration_s / 4
    # with a credit of one partition, partitions go one at a time; the next is admitted
    # when the servers acknowledge the push, so its push overlaps the previous pull
    part = 4_000_000
    one = simulate(prof, cl, ByteScheduler(partition_bytes=part, credit_bytes=1))
    push = pull = 4 * part / B                    # 4 workers into (out of) one server NIC
    assert one.iteration_s == pytest.approx(10 * push + pull, rel=1e-6)


def test_deadline_clock_catches_up_waits():
    # with layer-wise updates the input layer waits for its gradient; with the
    # emulated cluster's deadline clock the later layers' forward is not delayed by it
    prof = synthetic_profile([10_000_000, 10, 10, 10], fwd_s=0.01, bwd_s=0.0)
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B)
    seq = simulate(prof, cl, "bytescheduler")
    dl = simulate(prof, cl, "bytescheduler", compute_clock="deadline")
    wait = seq.layer_update_s[0]
    assert wait > 0.01
    assert seq.iteration_s == pytest.approx(wait + 4 * 0.01, rel=1e-6)
    assert dl.iteration_s == pytest.approx(max(wait, 4 * 0.01), rel=1e-6)
    # without layer-wise updates nothing is caught up: the forward starts after every update
    off = dict(layerwise_update=False)
    assert simulate(prof, cl, "wfbp", compute_clock="deadline", **off).iteration_s == \
        pytest.approx(simulate(prof, cl, "wfbp", **off).iteration_s, rel=1e-12)


def test_validate_replays_what_the_cell_ran():
    prof = synthetic_profile([2_000_000, 4_000_000, 1000], fwd_s=0.01, model="toy")
    row = {"model": "toy", "strategy": "mgwfbp+x", "base_strategy": "mgwfbp", "backend": "ps", "workers": 4,
           "servers": 4, "bandwidth": B, "compute_scale": 0.5, "size_scale": 0.5, "layerwise": False,
           "groups": [1, 2], "measured_step_s": 1.0, "message_s": 1e-4, "placement": "colocated"}
    t = validate([row], profiles={"toy": prof})
    small = synthetic_profile([1_000_000, 2_000_000, 500], fwd_s=0.01, model="toy")
    from pushpull.sim import MGWFBP
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B, colocated=True, message_s=1e-4)
    want = simulate(small, cl, MGWFBP(plan=[1, 2]), compute_scale=0.5, layerwise_update=False).iteration_s
    assert t.rows[0]["predicted_step_s"] == pytest.approx(want, rel=1e-12)
    assert t.rows[0]["strategy"] == "mgwfbp+x" and t.rows[0]["cell"] is row
    with pytest.raises(ValueError, match="plan"):
        validate([dict(row, groups=[1, 1])], profiles={"toy": prof})


def test_optimizer_on_the_training_thread():
    # layer-wise: step() after the backward, then per layer the pre-hook applies its tensors' updates
    # before the layer's forward (woken once when it had to wait); the deadline clock catches up the
    # pre-hooks' time but not step()'s
    from pushpull.sim import SimOptions

    prof = synthetic_profile([[10, 10], [10], [10, 10, 10]], fwd_s=0.01, bwd_s=0.02)
    fast = ClusterConfig(workers=2, bandwidth=math.inf, latency=0.0)
    u, s = 1e-3, 2e-3
    seq = simulate(prof, fast, "wfbp", options=SimOptions(update_s=u, step_call_s=s, wake_s=1.0, trace=False))
    assert seq.iteration_s == pytest.approx(prof.compute_s + s + 6 * u, rel=1e-9)   # nothing waits: no wake
    dl = simulate(prof, fast, "wfbp", options=SimOptions(update_s=u, step_call_s=s, compute_clock="deadline",
                                                        trace=False))
    assert dl.iteration_s == pytest.approx(prof.compute_s + s, rel=1e-9)   # 2-3 ms of hooks per 10 ms layer
    # a layer that waits pays the wake-up after the arrival; without layer-wise updates step() waits
    # for every reduction (one wake-up) and then runs
    big = synthetic_profile([10_000_000, 10], fwd_s=0.01, bwd_s=0.0)
    cl = ClusterConfig(workers=4, servers=4, bandwidth=B)
    base = simulate(big, cl, "wfbp", trace=False)
    w = 5e-3
    lw = simulate(big, cl, "wfbp", options=SimOptions(wake_s=w, update_s=u, trace=False))
    assert lw.iteration_s == pytest.approx(base.iteration_s + w + u + u, rel=1e-9)
    off = simulate(big, cl, "wfbp", layerwise_update=False, trace=False)
    offc = simulate(big, cl, "wfbp", options=SimOptions(layerwise_update=False, wake_s=w, step_call_s=s,
                                                        update_s=1.0, trace=False))
    assert offc.iteration_s == pytest.approx(off.iteration_s + w + s, rel=1e-9)   # update_s: layer-wise only
    with pytest.raises(ValueError, match="wake_s"):
        SimOptions(wake_s=-1.0)
    # validate() takes the three from a row
    row = {"model": "toy", "strategy": "wfbp", "backend": "ps", "workers": 4, "servers": 4, "bandwidth": B,
           "measured_step_s": 1.0, "layerwise": True, "update_s": u, "wake_s": w}
    assert validate([row], profiles={"toy": big}).rows[0]["predicted_step_s"] == \
        pytest.approx(lw.iteration_s, rel=1e-12)


def test_sim_cluster_takes_the_runtime_default_key_size_for_its_server_count():
    from pushpull.sim.config import ClusterConfig
    assert ClusterConfig(workers=8, bandwidth=1e9).ps_partition_bytes == 2048000
    assert ClusterConfig(workers=4, bandwidth=1e9).ps_partition_bytes == 4096000
    assert ClusterConfig(workers=8, bandwidth=1e9, ps_partition_bytes=65536).ps_partition_bytes == 65536
