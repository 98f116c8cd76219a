"""Smoke test of ``pushpull bench grid`` / ``pushpull bench report``: one tiny cell.

Runs on the emulated cluster where network namespaces can be made (root, ip,
tc), on loopback otherwise; passes either way but checks that the mode the
rows report is the one this machine supports.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "benchmarks" / "configs" / "smoke.json"


def _grid(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pushpull", "bench", "grid", str(CONFIG), "--out", str(out),
                           "--no-progress", *extra], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.timeout(180)
def test_grid_cell_resume_and_report(tmp_path):
    from pushpull.emulate.netns import netns_unavailable_reason

    expected = "namespaces" if netns_unavailable_reason() is None else "loopback"
    out = tmp_path / "smoke.jsonl"
    try:
        r = _grid(out)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 1
        row = rows[0]
        for k in ("model", "strategy", "backend", "workers", "servers", "placement", "bandwidth", "ratio",
                  "compute_scale", "size_scale", "step_s", "throughput", "try_step_s", "mode", "t_comm_s"):
            assert k in row, k
        assert (row["model"], row["strategy"], row["backend"], row["workers"]) == ("resnet50", "wfbp", "ps", 2)
        assert row["step_s"] > 0 and row["throughput"] > 0
        assert row["mode"] == expected, (row["mode"], netns_unavailable_reason())

        # resume: the cell is in the file, so nothing runs and nothing is appended
        r2 = _grid(out)
        assert r2.returncode == 0, r2.stderr[-3000:]
        stats = json.loads(r2.stdout.strip().splitlines()[-1])
        assert stats["cells_run"] == 0 and stats["cells_skipped"] == 1
        assert len(out.read_text().splitlines()) == 1
    finally:
        subprocess.run([sys.executable, "-m", "pushpull", "cluster", "cleanup"], capture_output=True, timeout=60)

    rep = subprocess.run([sys.executable, "-m", "pushpull", "bench", "report", str(out), "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "smoke.md").read_text()
    assert "| model | backend |" in md and "| resnet50 | ps | 2 |" in md and "1.00x" in md
    png = tmp_path / "smoke_speedup.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_layerwise_probe_measures_the_optimizer_paths():
    code = ("import json, torch; import pushpull.torch as bps; bps.init(); torch.set_num_threads(1); "
            "from pushpull.bench.grid import layerwise_probe; "
            "print(json.dumps(layerwise_probe('resnet50', 0.001, iters=3, warmup=1)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["tensors"] == 161 and res["layers"] > 0
    for k in ("update_lw_s", "step_lw_s", "step_s", "wake_s"):
        assert 0 <= res[k] < 1.0, (k, res[k])
    assert res["step_lw_s"] > 0 and res["step_s"] > 0 and res["wake_s"] > 0


def _namespaces_grid(config: str, out) -> list[dict]:
    """Run benchmarks/configs/<config>.json on the emulated cluster into ``out``; its rows (namespaces are
    removed afterwards whatever happened)."""
    cfg = ROOT / "benchmarks" / "configs" / f"{config}.json"
    try:
        r = subprocess.run([sys.executable, "-m", "pushpull", "bench", "grid", str(cfg), "--out", str(out),
                            "--no-progress"], capture_output=True, text=True, timeout=200, cwd=ROOT)
    finally:
        subprocess.run([sys.executable, "-m", "pushpull", "cluster", "cleanup"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.timeout(240)
def test_ps_vs_ring_cell_on_namespaces(tmp_path):
    """The PS-vs-ring grid at its smallest: both backends on the same shaped cluster, the report's
    comparison table, and the engine's default credit window recorded (no timing asserted)."""
    from pushpull.emulate.netns import congestion_selectable, netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    expected_cc = ("cubic" if congestion_selectable("cubic")
                   else open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip())
    out = tmp_path / "smoke_ps_vs_ring.jsonl"
    rows = {row["backend"]: row for row in _namespaces_grid("smoke_ps_vs_ring", out)}
    assert set(rows) == {"ps", "allreduce"}
    for row in rows.values():
        # cubic where the machine lets a namespace pick it, else the machine's own (with a warning)
        assert row["mode"] == "namespaces" and row["congestion"] == expected_cc
        assert row["step_s"] > 0 and row["placement"] == "separate"
    ps = rows["ps"]
    assert (ps["workers"], ps["servers"]) == (2, 2)
    # servers on other hosts: 'auto' credit = one partition per server (at least 2), not unlimited
    assert ps["engine_credit_bytes"] == 2 * ps["engine_partition_bytes"] == 2 * ps["ps_partition_bytes"]
    rep = subprocess.run([sys.executable, "-m", "pushpull", "bench", "report", str(out), "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "smoke_ps_vs_ring.md").read_text()
    assert "PS against all-reduce" in md and "| vgg16 | wfbp | 2 | 2 | separate | 100mbit |" in md


def test_report_bounds_per_placement():
    """c + bytes per link / B: M/B for a PS on its own hosts (n/k M/B with fewer servers), 2(n-1)/n M/B for
    the ring and a colocated PS with k = n."""
    from pushpull.bench.report import bounds

    cell = {"compute_s": 0.16, "grad_bytes": 8e6, "bandwidth_bytes_s": 12.5e6, "workers": 4, "servers": 4}
    sep = bounds(dict(cell, placement="separate"))
    assert sep["ps_bound_s"] == pytest.approx(0.16 + 0.64) and sep["ring_bound_s"] == pytest.approx(0.16 + 0.96)
    assert bounds(dict(cell, placement="colocated"))["ps_bound_s"] == pytest.approx(0.16 + 0.96)
    assert bounds(dict(cell, placement="separate", servers=2))["ps_bound_s"] == pytest.approx(0.16 + 1.28)
    assert bounds(dict(cell, placement="colocated", servers=2))["ps_bound_s"] is None
    assert bounds(dict(cell, compute_s=None)) == {"ps_bound_s": None, "ring_bound_s": None}


def test_grid_expands_processes_per_host_and_older_rows_keep_their_cells():
    from pushpull.bench.grid import cell_key, expand

    jobs = expand({"name": "x", "models": ["vgg16"], "strategies": ["wfbp"], "workers": [2], "local_size": [2],
                   "local_reduce": ["on", False], "grad_mb": 0.5})
    assert [(j["local_size"], j["local_reduce"]) for j in jobs] == [(2, "on"), (2, "off")]
    assert cell_key(dict(jobs[0], strategy="wfbp")) != cell_key(dict(jobs[1], strategy="wfbp"))
    # a row written before these fields ran one process per host with the default setting: same cell
    old = expand({"name": "x", "models": ["vgg16"], "strategies": ["wfbp"], "workers": [2], "grad_mb": 0.5})[0]
    row = {k: v for k, v in dict(old, strategy="wfbp").items() if k not in ("local_size", "local_reduce")}
    assert cell_key(row) == cell_key(dict(old, strategy="wfbp"))
    with pytest.raises(ValueError, match="local_reduce"):
        expand({"name": "x", "models": ["vgg16"], "local_reduce": ["sometimes"]})


def test_report_compares_the_local_reduce_with_flat_against_the_bound():
    from pushpull.bench.report import markdown

    base = {"model": "vgg16", "backend": "ps", "workers": 2, "servers": 2, "placement": "colocated",
            "bandwidth": "100mbit", "bandwidth_bytes_s": 12.5e6, "ratio": 0.25, "local_size": 2, "strategy": "wfbp",
            "compute_s": 0.16, "grad_bytes": 8e6, "t_comm_s": 1.0, "try_throughput": [1.0], "throughput": 1.0,
            "mode": "namespaces", "grad_mb": 8, "steps": 3, "try_step_s": [1.0]}
    rows = [dict(base, local_reduce="on", step_s=0.9, local_reduce_active=True,
                 link_bytes=[{"tx": 8e6, "rx": 8e6}, {"tx": 8e6, "rx": 8e6}]),
            dict(base, local_reduce="off", step_s=1.6, local_reduce_active=False,
                 link_bytes=[{"tx": 16e6, "rx": 16e6}, {"tx": 16e6, "rx": 16e6}])]
    md = markdown(rows, "x", [])
    line = next(ln for ln in md.splitlines() if ln.startswith("| vgg16 | wfbp | 2 x 2 |"))
    # 1.6 / 0.9 faster; bound c + M/B = 0.16 + 0.64 s (flat: c + 2 M/B); half the bytes; in force on / off
    assert "| 1600 | 900 | 1.78x | 800 | 1.12x | 1440 |" in line, line
    assert "| 0.50, 0.50 | yes / no |" in line, line


def test_local_reduce_cell_on_namespaces(tmp_path):
    """2 hosts x 2 processes with the local reduce on and off: on is in force only when asked, and each host's
    link bytes per step, read from its interface counters, about halve (bytes, not timing, are asserted)."""
    from pushpull.emulate.netns import netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    out = tmp_path / "smoke_hierarchical.jsonl"
    rows = {row["local_reduce"]: row for row in _namespaces_grid("smoke_hierarchical", out)}
    assert set(rows) == {"on", "off"}
    assert rows["on"]["local_reduce_active"] is True and rows["off"]["local_reduce_active"] is False
    for h_on, h_off in zip(rows["on"]["link_bytes"], rows["off"]["link_bytes"]):
        ratio = (h_on["tx"] + h_on["rx"]) / (h_off["tx"] + h_off["rx"])
        assert 0.4 < ratio < 0.7, (rows["on"]["link_bytes"], rows["off"]["link_bytes"])
