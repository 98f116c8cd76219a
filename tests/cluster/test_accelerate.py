"""Hugging Face Accelerate on pushpull (pushpull.accelerate.PushPullAccelerator): an Accelerate training loop of 2
workers (tests/scripts/accelerate_worker.py) under pushpull launch, torchrun and mpirun, against the same training
replayed in one process."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("accelerate", reason="the [accelerate] extra is not installed")
WORKER = str(ROOT / "tests" / "scripts" / "accelerate_worker.py")
LAUNCHERS = {
    # accelerate takes its time to import before a worker registers (tests/cluster/test_huggingface.py)
    "pushpull launch": [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1", "--env",
                        "OMP_NUM_THREADS=1", "--env", "PUSHPULL_REGISTER_TIMEOUT=90", "--", sys.executable, WORKER],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", WORKER],
    # Open MPI's rank variables (OMPI_COMM_WORLD_*) are others that Accelerate reads
    "mpirun": [shutil.which("mpirun") or "mpirun", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1"]
    + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + [sys.executable, WORKER],
}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def ranks(request) -> list[dict]:
    if request.param == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("no mpirun here (Debian: apt-get install openmpi-bin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PUSHPULL_"))}
    res = subprocess.run(LAUNCHERS[request.param], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**env, "OMP_NUM_THREADS": "1", "PUSHPULL_REGISTER_TIMEOUT": "90"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    rows = sorted((json.loads(m) for m in re.findall(r"ACCELERATE (\{.*\})", out)), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], out[-3000:]
    return rows


def test_the_workers_train_as_one_process_on_the_global_batch(ranks):
    """Rank 0 replays the run in one process (each step the mean gradient of both workers' micro-batches,
    clipped, the schedule stepped twice): the parameters agree to float rounding."""
    assert ranks[0]["replay_max_diff"] < 1e-5


def test_every_worker_ends_with_the_same_parameters(ranks):
    assert ranks[0]["params"] == ranks[1]["params"]


def test_each_epoch_shares_the_samples_out_between_the_workers(ranks):
    for epoch in range(len(ranks[0]["seen"])):
        mine, theirs = ranks[0]["seen"][epoch], ranks[1]["seen"][epoch]
        assert not set(mine) & set(theirs)
        assert sorted(mine + theirs) == list(range(96))


def test_the_shuffle_differs_between_epochs(ranks):
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1]


def test_accelerate_knows_the_job_and_runs_no_torch_distributed_group(ranks):
    for r in ranks:
        assert (r["process_index"], r["num_processes"], r["is_main"]) == (r["rank"], 2, r["rank"] == 0)
        assert r["torch_distributed"] is False


def test_gather_for_metrics_returns_every_evaluation_sample_once(ranks):
    for r in ranks:
        assert r["eval_indices"] == list(range(13))  # 13 samples, batches of 4 on 2 workers: 3 repeated, dropped


def test_objects_and_reductions_span_the_workers(ranks):
    for r in ranks:
        assert r["objects"] == ["rank0", "rank1"]
        assert r["reduced"] == [3.0]
        assert r["scalars"] == [0.0, 1.0]  # a 0-dim tensor gathers as one row per worker
    assert [r["padded"] for r in ranks] == [[1.0, 0.0], [1.0, 1.0]]


def test_only_rank_0_saves(ranks):
    assert [r["wrote"] for r in ranks] == [True, False]


def test_a_parameter_the_forward_pass_never_uses_stays_put(ranks):
    assert ranks[0]["spare_unchanged"] is True


def test_the_schedule_steps_once_per_worker_per_optimizer_step(ranks):
    """Accelerate's rule for a job of n processes: 12 optimizer steps, the schedule stepped 24 times."""
    assert ranks[0]["lr"] == pytest.approx(0.05 / (1 + 0.02 * 24))
