"""One policy, two executors (pushpull.policy): a strategy is one file in the policy package, and the
runtime, the simulator, the benchmark grid and the configuration all pick it up with no other edit.

The test writes such a file into a temporary ``pushpull/policy`` folder added to the package's search
path (tests/extension_files.py), then runs the new strategy through the simulator and through the
runtime executor against a fake backend; tests/cluster/test_policy.py runs it in a real two-worker job."""
from __future__ import annotations

import pytest

import pushpull.policy as policy
from extension_files import strategy_file


@pytest.fixture()
def pairs(tmp_path):
    """The new strategy's file, on pushpull.policy's path while the test runs (tests/extension_files.py)."""
    with strategy_file(tmp_path) as root:
        yield root


def test_the_registry_lists_the_builtin_strategies_in_order():
    assert policy.names() == ["bsp", "wfbp", "fusion", "mgwfbp", "bytescheduler", "auto"]


def test_a_new_file_is_a_strategy_everywhere(pairs):
    from pushpull.bench.grid_spec import strategy_spec
    from pushpull.config import load_config
    from pushpull.sim.executors import STRATEGIES as SIM
    from pushpull.sim.executors import make_strategy as sim_make
    from pushpull.torch.executors import names as runtime_names

    assert "pairs" in policy.names() and "pairs" in runtime_names()
    assert load_config({"PUSHPULL_STRATEGY": "pairs"}).strategy == "pairs"
    assert strategy_spec("pairs", {})["base"] == "pairs"
    sim_make("pairs")
    assert "pairs" in SIM


def test_without_the_file_the_name_is_refused_everywhere():
    from pushpull.bench.grid_spec import strategy_spec
    from pushpull.config import ConfigError, load_config
    from pushpull.sim.executors import make_strategy as sim_make

    with pytest.raises(ConfigError, match="PUSHPULL_STRATEGY"):
        load_config({"PUSHPULL_STRATEGY": "pairs"})
    with pytest.raises(ValueError, match="pairs"):
        strategy_spec("pairs", {})
    with pytest.raises(ValueError, match="pairs"):
        sim_make("pairs")


def test_the_simulator_runs_the_new_strategy_by_its_plan(pairs):
    from pushpull.profiles import load_profile
    from pushpull.sim import ClusterConfig, parse_bandwidth, simulate
    from pushpull.sim.events import ready_stream
    from pushpull.sim.executors import StrategyContext
    from pushpull.sim.executors import make_strategy as sim_make

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
    from pushpull.torch.executors import make_strategy

    comm = Doubling()
    st = make_strategy("pairs", comm=comm, warmup_steps=1)
    drive(st, 1, mixed_dtypes=False)  # warm-up: measures ready times
    comm.sent.clear()
    drive(st, 2, mixed_dtypes=False)
    # planned, both steps: two pairs and the odd one alone
    assert comm.sent == ["pairs[g4+1]", "pairs[g2+1]", "g0"] * 2


@pytest.mark.parametrize("nbytes, key, itemsize, cap, sizes", [
    (4 << 20, 4_096_000, 4, None, [4 << 20]),                     # a 96 KiB tail joins the key before it
    (4_096_000 + 600_000, 4_096_000, 4, None, [4_096_000, 600_000]),  # over 1/8 of a key: a key of its own
    (4 << 20, 4_096_000, 4, 4_100_000, [4_096_000, 98_304]),      # never over the message cap
    (40, 8, 4, None, [8, 8, 8, 8, 8]),                            # exact multiples: nothing to fold
    (10, 4, 2, None, [4, 4, 2]),                                  # whole elements (2 bytes: a 2-byte dtype)
    (0, 8, 4, None, []),                                          # an empty tensor has no keys
], ids=["tail-folded", "tail-kept", "cap", "multiple", "small", "empty"])
def test_key_sizes(nbytes, key, itemsize, cap, sizes):
    from pushpull.policy.base import key_sizes

    got = key_sizes(nbytes, key, itemsize, cap)
    assert got == sizes and sum(got) == nbytes
