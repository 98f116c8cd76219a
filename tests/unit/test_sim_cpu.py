"""The simulator's CPU charge per byte (pushpull.sim.config.CpuCosts): one case per test."""
from __future__ import annotations

import json

import pytest

from pushpull.profiles import LayerProfile, Profile, TensorSpec
from pushpull.sim import ClusterConfig, CpuCosts, simulate
from pushpull.sim.config import read_probe
from pushpull.sim.plan import plan

GB = 1e9
# primitives as `pushpull bench probe` measured them on the 2-core VM (CPU-seconds per byte)
PROBE = {"cpu_tcp_send": 0.27 / GB, "cpu_tcp_recv": 0.49 / GB, "cpu_zmq_send": 0.30 / GB,
         "cpu_zmq_recv": 0.19 / GB, "cpu_curve_send": 0.80 / GB, "cpu_curve_recv": 0.84 / GB,
         "cpu_sum": 0.08 / GB, "cpu_aesgcm_encrypt": 0.25 / GB, "cpu_aesgcm_decrypt": 0.26 / GB}
OLD_ROW = {"backend": "ps", "workers": 4, "servers": 4, "t_small_s": 1e-3, "t_stream_s": 3e-4}


def one_tensor(nbytes: int, compute_s: float = 0.0) -> Profile:
    return Profile(model="one", batch_size=1, layers=[
        LayerProfile("l", compute_s / 3, 2 * compute_s / 3, [TensorSpec("w", nbytes // 4)])])


def model(layers: int = 16, mb_each: float = 2.0, compute_s: float = 0.02) -> Profile:
    return Profile(model="m", batch_size=1, layers=[
        LayerProfile(f"l{i}", compute_s / layers / 3, 2 * compute_s / layers / 3,
                     [TensorSpec(f"w{i}", int(mb_each * 1e6) // 4)]) for i in range(layers)])


def cluster(backend, bw, cpu=None, n=4):
    return ClusterConfig(workers=n, servers=n, bandwidth=bw, backend=backend, cpu=cpu)


def test_cpu_charge_turns_a_ps_win_into_a_ring_win_at_10gbit_on_2_shared_cores():
    prof = model()
    bw = 10e9 / 8
    cpu = CpuCosts.from_probe(PROBE, encryption="curve", shared_cores=2)
    ps0 = plan(prof, cluster("ps", bw)).best.iteration_s
    ar0 = plan(prof, cluster("allreduce", bw)).best.iteration_s
    assert ps0 < ar0                       # the link alone: the PS moves M each way, the ring 2(n-1)/n M
    ps1 = plan(prof, cluster("ps", bw, cpu)).best.iteration_s
    ar1 = plan(prof, cluster("allreduce", bw, cpu)).best.iteration_s
    assert ar1 < ps1                       # 8 processes on 2 cores, CURVE on every PS byte: the ring wins


def test_cpu_charge_leaves_the_ps_ahead_at_100mbit():
    prof = model()
    bw = 100e6 / 8
    cpu = CpuCosts.from_probe(PROBE, encryption="curve", shared_cores=2)
    ps = plan(prof, cluster("ps", bw, cpu)).best.iteration_s
    ar = plan(prof, cluster("allreduce", bw, cpu)).best.iteration_s
    assert ps < ar
    assert ps == pytest.approx(plan(prof, cluster("ps", bw)).best.iteration_s)   # link-bound: CPU hidden


def test_old_probe_rows_charge_nothing():
    assert CpuCosts.from_probe(OLD_ROW) is None
    assert CpuCosts.from_probe(None) is None


def test_old_probe_file_gives_unchanged_predictions(tmp_path):
    f = tmp_path / "host_probe.jsonl"
    f.write_text(json.dumps(OLD_ROW) + "\n")
    cpu = CpuCosts.from_probe(read_probe(f))
    prof = model()
    for backend in ("ps", "allreduce"):
        assert (simulate(prof, cluster(backend, 10e9 / 8, cpu), "wfbp", trace=False).iteration_s
                == simulate(prof, cluster(backend, 10e9 / 8), "wfbp", trace=False).iteration_s)


def test_read_probe_takes_the_latest_row_with_cpu_figures(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (OLD_ROW, {"kind": "cpu", **PROBE, "cpu_sum": 1e-9}, OLD_ROW)))
    assert read_probe(f)["cpu_sum"] == 1e-9


@pytest.mark.parametrize("backend", ["ps", "allreduce"])
def test_cpu_charge_scales_with_bytes(backend):
    """CPU-bound (an infinitely fast link): the time of a reduction is proportional to its bytes (one
    server, keys larger than both tensors, so the PS does not spread the larger one wider)."""
    cpu = CpuCosts.from_probe(PROBE, encryption="none")
    cl = ClusterConfig(workers=4, servers=1, bandwidth=1e15, backend=backend, latency=0.0, cpu=cpu,
                       ps_partition_bytes=16_000_000, dispatch_s=0.0)
    t1 = simulate(one_tensor(4_000_000), cl, "bsp", trace=False).iteration_s
    t2 = simulate(one_tensor(8_000_000), cl, "bsp", trace=False).iteration_s
    assert t1 > 0 and t2 == pytest.approx(2 * t1, rel=1e-6)


def test_ps_one_key_alone_goes_at_the_slowest_process():
    """One key, one server, n pushes into it: the server's CPU takes n x server_push per byte pushed."""
    c = CpuCosts(worker_push=1e-9, worker_pull=1e-9, server_push=2e-9, server_pull=1e-9)
    n, M = 4, 1_000_000
    cl = ClusterConfig(workers=n, servers=1, bandwidth=1e15, latency=0.0, cpu=c)
    t = simulate(one_tensor(M), cl, "bsp", trace=False).iteration_s
    assert t == pytest.approx(M * n * 2e-9 + M * n * 1e-9, rel=1e-6)   # push: server-bound; pull: likewise


def test_ring_time_is_max_of_wire_and_cpu():
    c = CpuCosts(ring_send=1e-9, ring_recv=1e-9, ring_sum=1e-9)
    n, M = 4, 8_000_000
    cpu_s = 2 * (n - 1) / n * M * 2e-9 + (n - 1) / n * M * 1e-9
    slow = ClusterConfig(workers=n, bandwidth=1e6, backend="allreduce", latency=0.0, cpu=c)
    fast = ClusterConfig(workers=n, bandwidth=1e15, backend="allreduce", latency=0.0, cpu=c, dispatch_s=0.0)
    assert simulate(one_tensor(M), fast, "bsp", trace=False).iteration_s == pytest.approx(cpu_s, rel=1e-6)
    wire = 2 * (n - 1) * M / n / 1e6
    assert simulate(one_tensor(M), slow, "bsp", trace=False).iteration_s == pytest.approx(wire, rel=1e-3)


def test_shared_cores_divide_the_pool():
    c1 = CpuCosts(ring_send=1e-9, ring_recv=1e-9)
    c2 = CpuCosts(ring_send=1e-9, ring_recv=1e-9, shared_cores=2)
    mk = lambda c: ClusterConfig(workers=8, bandwidth=1e15, backend="allreduce", latency=0.0, cpu=c,  # noqa: E731
                                 dispatch_s=0.0)
    t1 = simulate(one_tensor(8_000_000), mk(c1), "bsp", trace=False).iteration_s
    t2 = simulate(one_tensor(8_000_000), mk(c2), "bsp", trace=False).iteration_s
    assert t2 == pytest.approx(4 * t1, rel=1e-6)     # 8 ranks on 2 cores: a quarter core each


def test_encryption_adds_its_cost_to_the_ps_only():
    plain = CpuCosts.from_probe(PROBE, encryption="none")
    curve = CpuCosts.from_probe(PROBE, encryption="curve")
    aes = CpuCosts.from_probe(PROBE, encryption="aesgcm")
    assert curve.worker_push == pytest.approx(plain.worker_push + PROBE["cpu_curve_send"])
    assert aes.server_push == pytest.approx(plain.server_push + PROBE["cpu_aesgcm_decrypt"])
    assert curve.ring_send == plain.ring_send and curve.ring_sum == plain.ring_sum


def test_cpu_costs_reject_bad_values():
    with pytest.raises(ValueError, match="worker_push"):
        CpuCosts(worker_push=-1.0)
    with pytest.raises(ValueError, match="shared_cores"):
        CpuCosts(shared_cores=0)
    with pytest.raises(ValueError, match="encryption"):
        CpuCosts.from_probe(PROBE, encryption="rot13")


def test_auto_plan_reads_the_host_probe_and_picks_the_ring_when_the_ps_is_cpu_bound(tmp_path):
    from pushpull.torch.executors import auto_plan

    f = tmp_path / "host_probe.jsonl"
    f.write_text(json.dumps({"kind": "cpu", **PROBE}) + "\n")
    cpu = auto_plan.host_cpu(str(f), shared_cores=2, auth="auto")
    assert cpu.worker_push == pytest.approx(PROBE["cpu_zmq_send"] + PROBE["cpu_curve_send"])
    lane = auto_plan.host_cpu(str(f), shared_cores=2, auth="auto", data_lane=True)
    assert lane.worker_push == pytest.approx(PROBE["cpu_tcp_send"] + PROBE["cpu_aesgcm_encrypt"])
    prof = model()
    bw = 10e9 / 8

    def pick(c):
        clusters = {b: ClusterConfig(workers=4, servers=4, bandwidth=bw, backend=b, cpu=c)
                    for b in ("ps", "allreduce")}
        return auto_plan.rank_candidates(prof, clusters, True, 64 << 20, 1e-3)[0]["backend"]
    assert pick(None) == "ps"
    assert pick(cpu) == "allreduce"


def test_auto_plan_without_a_host_probe_charges_nothing(tmp_path):
    from pushpull.torch.executors import auto_plan

    f = tmp_path / "old.jsonl"
    f.write_text(json.dumps(OLD_ROW) + "\n")
    assert auto_plan.host_cpu(None) is None
    assert auto_plan.host_cpu(str(f)) is None


def test_the_probe_printout_charges_what_the_data_path_is():
    """pushpull bench probe's per-role lines: over the data lanes (the default for keys >= 1 MiB) a PS byte
    costs a socket's send plus AES-GCM, not ZeroMQ plus CURVE."""
    from pushpull.bench.cpu_probe import roles

    row = {"cpu_tcp_send": 0.2e-9, "cpu_tcp_recv": 0.1e-9, "cpu_zmq_send": 0.5e-9, "cpu_zmq_recv": 0.2e-9,
           "cpu_curve_send": 0.65e-9, "cpu_curve_recv": 0.48e-9, "cpu_aesgcm_encrypt": 0.08e-9,
           "cpu_aesgcm_decrypt": 0.08e-9, "cpu_sum": 0.05e-9}
    lanes = roles(row, 4, 2, data_lane=True)[0]
    zmq = roles(row, 4, 2, data_lane=False)[0]
    assert "over data lanes" in lanes and "PS worker push 0.28 " in lanes   # 0.2 socket + 0.08 AES-GCM
    assert "over ZeroMQ" in zmq and "PS worker push 1.15 " in zmq           # 0.5 ZeroMQ + 0.65 CURVE
