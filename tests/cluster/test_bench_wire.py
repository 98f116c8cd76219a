"""``pushpull bench wire`` end to end at a tiny size on loopback: the raw TCP stream, gloo and push_pull
(one auth mode plus a variant) as real processes, and every expected row with a positive CPU figure in the
JSON lines. No timing goal is asserted. The arithmetic is tests/unit/test_bench_wire.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_wire_bench_loopback_rows(tmp_path):
    out = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, "-m", "pushpull", "bench", "wire", "--transports", "loopback", "--auth",
                        "none", "--variant", "plainv:PUSHPULL_AUTH=plain", "--gb", "0.05", "--prim-gb", "0.02",
                        "--tensors", "4", "--tensor-mib", "1", "--warmup", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(x["method"], x["transport"], x["auth"], x["role"]) for x in rows}
    want = {("raw", "loopback", "-", "proc0 (connect)"), ("raw", "loopback", "-", "proc1 (listen)"),
            ("gloo", "loopback", "-", "rank0"), ("gloo", "loopback", "-", "rank1")}
    want |= {("push_pull", "loopback", a, role) for a in ("none", "plain+plainv")
             for role in ("worker0", "worker1", "server0")}
    assert want <= got
    assert {"memcpy", "sum f32", "aes128gcm enc", "aes128gcm dec"} <= {x["method"] for x in rows}
    for x in rows:
        assert x["cpu_s"] > 0 and x["cpu_per_gb_payload"] > 0, x
        if x["transport"] != "-":
            assert x["x_gloo"] > 0 and x["x_raw"] > 0, x
    assert "x gloo" in r.stdout and "goal" in r.stdout
