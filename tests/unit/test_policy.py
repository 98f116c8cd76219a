"""One policy, two executors (pushpull.policy): a strategy is one file in the policy package, and the
runtime, the simulator, the benchmark grid and the configuration all pick it up with no other edit.

The test writes such a file into a temporary ``pushpull/policy`` folder added to the package's search
path, then runs the new strategy through the simulator, through the runtime executor against a fake
backend, and in a real two-worker job under the launcher whose processes find the folder on their
PYTHONPATH, the worker asking only for ``strategy="pairs"``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pushpull.policy as policy

ROOT = Path(__file__).resolve().parents[2]

PAIRS = textwrap.dedent('''
    """pairs: every two consecutive gradients (in ready order) travel as one buffer; a test strategy."""
    from pushpull.policy.base import Policy


    class Pairs(Policy):
        """consecutive gradients in twos"""
        name = "pairs"
        release = "plan"
        options = {"size": 2}

        @classmethod
        def plan(cls, ready_s, sizes, size=2, **_):
            return [list(range(i, min(i + size, len(sizes)))) for i in range(0, len(sizes), size)]
''')


@pytest.fixture()
def pairs(tmp_path):
    """The new strategy's file in tmp/pushpull/policy: this process adds the folder to the package's path;
    launched processes find it on their PYTHONPATH (pushpull.extend)."""
    pkg = tmp_path / "pushpull" / "policy"
    pkg.mkdir(parents=True)
    (pkg / "pairs.py").write_text(PAIRS)
    policy.__path__.append(str(pkg))
    policy.refresh()
    yield tmp_path
    policy.__path__.remove(str(pkg))
    sys.modules.pop("pushpull.policy.pairs", None)
    policy.refresh()


def test_the_registry_lists_the_builtin_strategies_in_order():
    assert policy.names() == ["bsp", "wfbp", "fusion", "mgwfbp", "bytescheduler", "auto"]


def test_the_policy_package_imports_neither_torch_nor_the_simulator():
    code = ("import sys, pushpull.policy as p; [p.get(n) for n in p.names()]; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('pushpull.sim') "
            "or m.startswith('pushpull.torch')]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_new_file_is_a_strategy_everywhere(pairs):
    from pushpull.bench.grid import strategy_spec
    from pushpull.config import load_config
    from pushpull.sim.strategies import STRATEGIES as SIM
    from pushpull.sim.strategies import make_strategy as sim_make
    from pushpull.torch.strategies import names as runtime_names

    assert "pairs" in policy.names() and "pairs" in runtime_names()
    assert load_config({"PUSHPULL_STRATEGY": "pairs"}).strategy == "pairs"
    assert strategy_spec("pairs", {})["base"] == "pairs"
    sim_make("pairs")
    assert "pairs" in SIM


def test_without_the_file_the_name_is_refused_everywhere():
    from pushpull.bench.grid import strategy_spec
    from pushpull.config import ConfigError, load_config
    from pushpull.sim.strategies import make_strategy as sim_make

    with pytest.raises(ConfigError, match="PUSHPULL_STRATEGY"):
        load_config({"PUSHPULL_STRATEGY": "pairs"})
    with pytest.raises(ValueError, match="pairs"):
        strategy_spec("pairs", {})
    with pytest.raises(ValueError, match="pairs"):
        sim_make("pairs")


def test_the_simulator_runs_the_new_strategy_by_its_plan(pairs):
    from pushpull.profiles import load_profile
    from pushpull.sim import ClusterConfig, parse_bandwidth, simulate
    from pushpull.sim.engine import ready_stream
    from pushpull.sim.strategies import StrategyContext
    from pushpull.sim.strategies import make_strategy as sim_make

    prof = load_profile("resnet50")
    cluster = ClusterConfig(workers=4, servers=4, bandwidth=parse_bandwidth("10gbit"))
    ready, layer_ready = ready_stream(prof)
    st = sim_make("pairs", size=3)
    tasks = st.tasks(StrategyContext(prof, cluster, ready, layer_ready, prof.bwd_s))
    carried = [t for t in ready if t.nbytes > 0]
    assert [len(t.parts) for t in tasks[:-1]] == [3] * (len(tasks) - 1)
    assert sum(len(t.parts) for t in tasks) == len(carried)
    res = simulate(prof, cluster, st)
    assert res.iteration_s > 0 and res.strategy == "pairs(size=3)"


@pytest.fixture(scope="module")
def single_process():
    import pushpull.torch as bps

    bps.init()  # no cluster in the environment: size 1, nothing started
    yield bps


def test_the_runtime_executor_fuses_by_the_plan_and_writes_back(pairs, single_process):
    from fakes import Doubling, drive
    from pushpull.torch.strategies import make_strategy

    comm = Doubling()
    st = make_strategy("pairs", comm=comm, warmup_steps=1)
    drive(st, 1, mixed_dtypes=False)  # warm-up: measures ready times
    comm.sent.clear()
    drive(st, 2, mixed_dtypes=False)
    # planned, both steps: two pairs and the odd one alone
    assert comm.sent == ["pairs[g4+1]", "pairs[g2+1]", "g0"] * 2


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
