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
            "from pushpull.bench.layerwise_probe import layerwise_probe; "
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
