"""transformers.Trainer on pushpull (pushpull.huggingface.PushPullTrainer): a small GPT-2 from a config, 2
workers under pushpull launch and under torchrun (tests/scripts/hf_worker.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers", reason="the [huggingface] extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the [huggingface] extra (accelerate, which Trainer needs) is not installed")


WORKER = str(ROOT / "tests" / "scripts" / "hf_worker.py")
# (command, optimizer steps): transformers and accelerate take their time to import before a worker registers:
# 15 s (the default registration deadline) ran out once on this VM with the scheduler and server up, no worker in yet
LAUNCHERS = {
    "pushpull launch": ([sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1", "--env",
                         "OMP_NUM_THREADS=1", "--env", "PUSHPULL_REGISTER_TIMEOUT=90", "--", sys.executable, WORKER,
                         "60"], 60),
    # torchrun's (and accelerate launch's) rank variables would make Accelerate start a torch.distributed job
    "torchrun": ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", WORKER,
                  "20"], 20),
}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def hf_job(request) -> tuple[list[tuple], int]:
    argv, steps = LAUNCHERS[request.param]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PUSHPULL_REGISTER_TIMEOUT": "90"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    rows = re.findall(r"HF rank (\d) of (\d): eval loss ([\d.]+) -> ([\d.]+); identical parameters (\w+); "
                      r"gradient averages (\d+); Accelerate (\w+), model (\w+)", out)
    assert len(rows) == 2, out[-3000:]
    return rows, steps


def test_both_workers_end_with_identical_parameters(hf_job):
    rows, _ = hf_job
    assert [r[4] for r in rows] == ["True", "True"]


def test_every_optimizer_step_averaged_the_gradients(hf_job):
    rows, steps = hf_job
    assert [r[5] for r in rows] == [str(steps)] * 2


def test_accelerate_runs_each_worker_as_one_process_without_ddp(hf_job):
    rows, _ = hf_job
    assert [(r[6], r[7]) for r in rows] == [("NO", "GPT2LMHeadModel")] * 2


def test_the_model_learns(hf_job):
    rows, _ = hf_job
    for _, _, before, after, *_ in rows:
        assert float(after) < float(before) - 1.5  # 5.35 -> 3.04 nats per byte in 60 steps, -> 3.40 in 20
