"""Compression end to end: the digits example trains to a stated accuracy with
onebit + error feedback + nesterov momentum under the launcher (2 workers,
1 server), with every gradient tensor compressed.

Measured (10 epochs, peak lr 0.025 per worker with the example's warm-up and
cosine decay, deterministic for a seed): seeds 0, 1, 2 reach 0.961, 0.978,
0.981; the uncompressed baseline 0.964, 0.978, 0.986. Seed 0 is the worst of
the three, so the 0.92 threshold has about 4 pp of margin. Full table:
docs/results/compression.md.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_digits.py")
THRESHOLD = 0.92


def _summary(out: str) -> dict:
    for line in reversed(out.splitlines()):
        i = line.find('{"test_accuracy"')
        if i >= 0:
            return json.loads(line[i:])
    raise AssertionError(f"no JSON summary in the output:\n{out[-3000:]}")


def test_onebit_ef_nesterov_reaches_accuracy_with_two_workers():
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1",
            "--env", "OMP_NUM_THREADS=1", "--env", "PUSHPULL_TIMEOUT=30", "--",
            sys.executable, EXAMPLE, "--compression", "onebit", "--ef", "vanilla", "--momentum", "nesterov",
            "--min-compress-bytes", "0", "--lr", "0.025", "--epochs", "10", "--seed", "0",
            "--min-accuracy", str(THRESHOLD), "--json", "--no-progress"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    s = _summary(out)
    assert s["workers"] == 2 and s["test_accuracy"] >= THRESHOLD, s
    # momentum moved into the worker's chain: the optimizer runs without it
    assert s["sgd_momentum"] == 0.0 and s["spec"]["momentum"] == "nesterov", s
    # every gradient tensor went through onebit: ~32x fewer bytes (headers are the rest)
    assert s["compressed_fraction"] == 1.0, s
    assert s["bytes_per_step"] < s["grad_bytes_per_step"] / 25, s


def test_nesterov_with_optimizer_momentum_is_refused():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update(OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, EXAMPLE, "--compression", "onebit", "--momentum", "nesterov",
                          "--sgd-momentum", "0.9", "--epochs", "1", "--no-progress"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert res.returncode != 0
    assert "second time" in res.stderr, res.stderr[-2000:]
