"""The pieces a scheduler that takes a running job over rebuilds from its nodes (pushpull.cluster): the
tensors' placements (Assigner.restore) and the recovery settings. The takeover itself, with real processes:
tests/cluster/test_scheduler_restart.py."""
from __future__ import annotations

import pytest

from pushpull.cluster.assign import Assigner
from pushpull.config import ConfigError, load_config


def _report(name: str, key: int, servers: list[int], parts=(400, 400)) -> dict:
    return {"name": name, "shape": [200], "dtype": "float32", "parts": list(parts), "key": key, "servers": servers}


def test_a_known_tensor_gets_the_placement_the_workers_hold():
    a = Assigner(2)
    a.restore([(0, _report("w", 3, [1, 0])), (1, _report("w", 3, [1, 0]))], 0, set())
    assert a.assign(1, {"name": "w", "shape": [200], "dtype": "float32", "parts": [400, 400]}) == \
        {"key": 3, "servers": [1, 0]}
    assert a.tensors["w"]["ranks"] == {0, 1}


def test_a_new_tensor_gets_a_key_above_every_key_a_worker_or_server_holds():
    a = Assigner(2)
    a.restore([(0, _report("w", 3, [1, 0]))], 9, set())  # a server holds tensor key 9 (a lost worker's)
    assert a.assign(0, {"name": "new", "shape": [1], "dtype": "float32", "parts": [4]})["key"] == 10


def test_loads_are_rebuilt_so_the_balance_goes_on():
    a = Assigner(2)
    a.restore([(0, _report("w", 1, [0, 0], parts=(800, 800)))], 0, set())
    assert a.load == [1600, 0]
    assert a.assign(0, {"name": "b", "shape": [1], "dtype": "float32", "parts": [4]})["servers"] == [1]


def test_a_lost_server_gets_nothing_new():
    a = Assigner(2)
    a.restore([], 0, {1})
    assert a.assign(0, {"name": "b", "shape": [1], "dtype": "float32", "parts": [4, 4]})["servers"] == [0, 0]


def test_a_declaration_that_differs_from_the_restored_one_is_an_error_naming_both_ranks():
    a = Assigner(2)
    a.restore([(0, _report("w", 1, [0, 1]))], 0, set())
    got = a.assign(1, {"name": "w", "shape": [201], "dtype": "float32", "parts": [400, 404]})
    assert "rank 0" in got["error"] and "rank 1" in got["error"]


@pytest.mark.parametrize("value", ["-1", "soon", "inf"])
def test_a_bad_recovery_time_is_refused_naming_the_setting(value):
    with pytest.raises(ConfigError, match="PUSHPULL_SCHEDULER_RECOVERY"):
        load_config({"PUSHPULL_SCHEDULER_RECOVERY": value})


def test_recovery_is_off_unless_asked():
    assert load_config({}).scheduler_recovery == 0 and not load_config({}).scheduler_recover


def test_a_replacement_server_gets_back_the_partitions_that_left_its_place():
    from pushpull.cluster.assign import Assigner

    a = Assigner(2)
    for n in range(4):
        a.assign(0, {"name": f"t{n}", "shape": [100], "dtype": "float32", "parts": [400]})
    before = {n: list(t["result"]["servers"]) for n, t in a.tensors.items()}
    moved = a.remove_server(1)
    assert set(moved.values()) == {0} and len(moved) == 2
    back = a.add_server(1)
    assert back == {k: 1 for k in moved}
    assert {n: t["result"]["servers"] for n, t in a.tensors.items()} == before and a.load == [800, 800]
    assert a.assign(0, {"name": "t9", "shape": [100], "dtype": "float32", "parts": [400]})["key"] == 5


def test_without_a_record_a_replacement_server_takes_a_fair_share():
    from pushpull.cluster.assign import Assigner

    a = Assigner(3)
    for n in range(6):
        a.assign(0, {"name": f"t{n}", "shape": [100], "dtype": "float32", "parts": [400]})
    a.remove_server(2)
    a.homes.clear()  # a scheduler that took the job over does not know where partitions came from
    back = a.add_server(2)
    assert len(back) == 2 and a.load == [800, 800, 800]


def test_a_key_whose_server_keeps_state_does_not_move_to_a_replacement():
    """A stateful key (DiLoCo's outer keys, asynchronous training's store) stays on the server that took it
    over, where its state is exact; a plain one goes back to its place."""
    from pushpull.cluster.assign import Assigner

    a = Assigner(2)
    for name, stateful in (("plain0", False), ("plain1", False), ("outer0", True), ("outer1", True)):
        a.assign(0, {"name": name, "shape": [100], "dtype": "float32", "parts": [400],
                     **({"keeps_state": True} if stateful else {})})
    assert [a.tensors[n]["result"]["servers"][0] for n in ("plain1", "outer1")] == [1, 1]
    a.remove_server(1)
    back = a.add_server(1)
    where = {n: t["result"]["servers"][0] for n, t in a.tensors.items()}
    assert where == {"plain0": 0, "plain1": 1, "outer0": 0, "outer1": 0} and len(back) == 1
