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


TRACE_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    import pushpull.torch as bps
    bps.init()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    kind = sys.argv[1]
    if kind == "distributed":
        opt = bps.DistributedOptimizer(base, named_parameters=model.named_parameters())
    elif kind == "scheduled":
        opt = bps.ScheduledOptimizer(model, base, named_parameters=model.named_parameters())
    else:
        opt = bps.AsyncOptimizer(base, named_parameters=model.named_parameters())
    for _ in range(4):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    if kind == "scheduled":
        opt.synchronize()
    bps.shutdown()
    events = json.load(open(sys.argv[2]))["traceEvents"]
    print("STEPS", sorted(e["args"]["step"] for e in events if e.get("cat") == "step"))
""")


@pytest.mark.parametrize("kind", ["distributed", "scheduled", "async"])
def test_every_wrapper_counts_the_timeline_steps(kind, tmp_path):
    """PUSHPULL_TRACE_ON with a window of steps 1..2: each wrapper's step() ends a timeline step, so the
    window opens and closes with layer-wise and asynchronous training too (not only DistributedOptimizer)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC", "BYTEPS", "PUSHPULL"))}
    env.update({"PUSHPULL_TRACE_ON": "1", "PUSHPULL_TRACE_DIR": str(tmp_path), "PUSHPULL_TRACE_START_STEP": "1",
                "PUSHPULL_TRACE_END_STEP": "2"})
    res = subprocess.run([sys.executable, "-c", TRACE_SCRIPT, kind, str(tmp_path / "0" / "timeline.json")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "STEPS [1, 2]" in res.stdout, res.stdout + res.stderr
