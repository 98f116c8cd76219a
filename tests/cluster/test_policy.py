"""One policy, two executors (pushpull.policy): a strategy is one file in the policy package, and the
runtime, the simulator, the benchmark grid and the configuration all pick it up with no other edit.

Here, with processes: the new strategy's file (tests/extension_files.py) runs in a real two-worker job
under the launcher whose processes find its folder on their PYTHONPATH, the worker asking only for
``strategy="pairs"``; and the policy package imports neither torch nor the simulator, in a fresh
interpreter. tests/unit/test_policy.py runs the new strategy through the simulator and the runtime
executor in this process."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from extension_files import strategy_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def pairs(tmp_path):
    """The new strategy's file, on pushpull.policy's path while the test runs (tests/extension_files.py)."""
    with strategy_file(tmp_path) as root:
        yield root


def test_the_policy_package_imports_neither_torch_nor_the_simulator():
    code = ("import sys, pushpull.policy as p; [p.get(n) for n in p.names()]; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('pushpull.sim') "
            "or m.startswith('pushpull.torch')]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


WORKER = textwrap.dedent('''
    import torch
    import pushpull.torch as bps

    bps.init()
    r, n = bps.rank(), bps.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), strategy="pairs", model=model)
    assert type(opt._strategy).__name__ == "PlannedPolicyStrategy[pairs]", type(opt._strategy)
    for step in range(4):
        opt.zero_grad()
        for p in model.parameters():
            p.grad = torch.full_like(p, float(r + 1 + step))
        opt.synchronize()
        want = sum(k + 1 + step for k in range(n)) / n
        for name, p in model.named_parameters():
            assert torch.allclose(p.grad, torch.full_like(p, want)), (step, name, p.grad.flatten()[:3], want)
        opt.step()
    print("plan", opt._strategy.plan, flush=True)
    print("ALL-OK", flush=True)
    bps.shutdown()
''')


def test_a_real_job_runs_the_new_strategy(pairs):
    script = pairs / "pairs_worker.py"  # not in the policy folder: every module there is imported
    script.write_text(WORKER)
    path = os.pathsep.join([str(pairs), os.environ.get("PYTHONPATH", str(ROOT))])
    argv = [sys.executable, "-m", "pushpull", "launch", "--workers", "2", "--servers", "1",
            "--env", "PUSHPULL_TIMEOUT=40", "--env", f"PYTHONPATH={path}", "--", sys.executable, str(script)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    out = res.stdout
    assert res.returncode == 0 and out.count("ALL-OK") == 2, (out + res.stderr)[-5000:]
    # the 4 parameters, in ready order, planned as two pairs on both workers
    assert out.count("plan [['2.weight', '2.bias'], ['0.weight', '0.bias']]") + \
        out.count("plan [['0.weight', '0.bias'], ['2.weight', '2.bias']]") == 2, out[-3000:]
