"""CUDA tensors through every path, under the real launcher (tests/scripts/cuda_worker.py): the PS's push_pull,
the optimizer wrapper, each compressor, Horovod's collectives, the broadcasts, DiLoCo (plain, and streaming with
int8), and the all-reduce backend (torch.distributed with NCCL for CUDA tensors). Skipped where CUDA is not
available (CI); scripts/gpu-check.sh runs it on a GPU machine. ``PUSHPULL_TEST_DEVICE=cpu`` runs the same cases
on the CPU, so the checks are themselves checked on machines without a GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cluster_cases import assert_case, shape_runner

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "scripts" / "cuda_worker.py")
DEVICE = os.environ.get("PUSHPULL_TEST_DEVICE", "cuda:0")
ENV = {"PUSHPULL_TIMEOUT": "60", "OMP_NUM_THREADS": "1", "PUSHPULL_TEST_DEVICE": DEVICE}

pytestmark = pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                                reason="no CUDA device (scripts/gpu-check.sh runs these on a GPU machine)")

# DiLoCo and streaming DiLoCo: the outer rounds on the servers, pseudo-gradients from CUDA parameters
PS_CASES = ["push_pull", "inplace_async", "optimizer", "ddp", "compression", "collectives", "broadcast_state",
            "diloco", "streaming"]
# the all-reduce backend reduces through torch.distributed (NCCL for CUDA tensors): the paths that reduce
ALLREDUCE_CASES = ["push_pull", "inplace_async", "optimizer"]
# the local reduce: the two workers of this host sum through shared memory first (PUSHPULL_LOCAL_REDUCE=1)
LOCAL_REDUCE_CASES = ["push_pull", "optimizer"]
SHAPES = {"ps-2w-2s": (2, 2, {}), "allreduce-2w": (2, 1, {"PUSHPULL_BACKEND": "allreduce"}),
          "local-reduce-2w": (2, 1, {"PUSHPULL_LOCAL_REDUCE": "1"})}
CASES_OF = {"ps-2w-2s": PS_CASES, "allreduce-2w": ALLREDUCE_CASES, "local-reduce-2w": LOCAL_REDUCE_CASES}


def launch(workers: int, servers: int, env: dict, cases: list[str]) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", str(workers), "--servers", str(servers)]
    for k, v in {**ENV, **env}.items():
        argv += ["--env", f"{k}={v}"]
    return subprocess.run(argv + ["--", sys.executable, WORKER, *cases], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def shape_runs():
    def launch_shape(shape: str):
        workers, servers, env = SHAPES[shape]
        return workers, launch(workers, servers, env, CASES_OF[shape])
    return shape_runner(launch_shape)


@pytest.mark.parametrize("case", PS_CASES)
def test_cuda_ps(shape_runs, case):
    workers, out = shape_runs("ps-2w-2s")
    assert_case(out, case, workers)


@pytest.mark.parametrize("case", ALLREDUCE_CASES)
def test_cuda_allreduce_backend(shape_runs, case):
    workers, out = shape_runs("allreduce-2w")
    assert_case(out, case, workers)


@pytest.mark.parametrize("case", LOCAL_REDUCE_CASES)
def test_cuda_local_reduce(shape_runs, case):
    workers, out = shape_runs("local-reduce-2w")
    assert out.count("local reduce active") == workers, out[-3000:]  # the shape tests what it says
    assert_case(out, case, workers)
