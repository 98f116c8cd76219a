"""register_step_callback: the optimizer wrappers' public hook runs once per step() (torch's own
register_step_post_hook would fire twice on them: they subclass the user's optimizer class and call its
step), and the auto-tuner attaches through it. Single-process mode, in a fresh interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, torch
    import pushpull.torch as bps
    bps.init()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    if sys.argv[1] == "distributed":
        opt = bps.DistributedOptimizer(base, named_parameters=model.named_parameters())
    else:
        opt = bps.ScheduledOptimizer(model, base, named_parameters=model.named_parameters())
    calls = []
    remove = opt.register_step_callback(lambda: calls.append(len(calls)))
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    remove()
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    print("CALLS", len(calls))
    try:
        bps.AutoTuner(torch.optim.SGD(model.parameters(), lr=0.1), model_elements=19)
    except TypeError as e:
        print("PLAIN", e)
""")


def _run(kind: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    res = subprocess.run([sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.mark.parametrize("kind", ["distributed", "scheduled"])
def test_callback_runs_once_per_step_until_removed(kind):
    assert "CALLS 3" in _run(kind)


def test_autotuner_refuses_an_optimizer_without_the_hook():
    out = _run("distributed")
    assert "PLAIN" in out and "register_step_callback" in out and "tuner.step()" in out, out
