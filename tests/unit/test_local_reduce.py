"""The hierarchical local reduce (pushpull/worker/local_reduce.py) without processes: the slices, the
decision every worker takes from the address book, the shared-memory names. Real processes on loopback:
tests/cluster/test_local_reduce.py."""
from __future__ import annotations

from pushpull.worker.local_reduce import LocalReduce, slice_bounds


def test_slices_cover_the_tensor_in_local_rank_order():
    assert slice_bounds(7, 2) == [(0, 3), (3, 7)]
    assert slice_bounds(1, 4) == [(0, 0), (0, 0), (0, 0), (0, 1)]
    assert slice_bounds(0, 2) == [(0, 0), (0, 0)]


def _book(hosts: list[str], modes: list[str]) -> dict:
    return {"num_workers": len(hosts), "job_id": "j", "workers": [
        {"rank": r, "hostname": h, "pid": 100 + r, "local_reduce": m} for r, (h, m) in enumerate(zip(hosts, modes))]}


def test_every_worker_decides_the_same_from_the_book():
    book = _book(["a", "a", "b", "b"], ["on"] * 4)
    args, _ = LocalReduce.plan(book, 3, 1, 2, "on", True, 0, "s")
    assert args["group"] == [2, 3] and args["num_machines"] == 2 and args["pids"] == {0: 102, 1: 103}
    # one rank with it off: flat for all, and each says who
    args, why = LocalReduce.plan(_book(["a", "a", "b", "b"], ["on", "on", "off", "on"]), 0, 0, 2, "on", True, 0, "s")
    assert args is None and "rank(s) [2]" in why
    # auto: off when every server is on this host, on over a network
    assert LocalReduce.plan(_book(["a"] * 2, ["auto"] * 2), 0, 0, 2, "auto", True, 0, "s")[0] is None
    assert LocalReduce.plan(_book(["a"] * 2, ["auto"] * 2), 0, 0, 2, "auto", False, 0, "s")[0] is not None
    # a "machine" whose ranks are on two hosts: BYTEPS_LOCAL_SIZE is wrong, stay flat
    args, why = LocalReduce.plan(_book(["a", "b"], ["on"] * 2), 0, 0, 2, "on", False, 0, "s")
    assert args is None and "different hosts" in why
    # elastic training renumbers ranks: flat
    assert LocalReduce.plan(book, 0, 0, 2, "on", False, 2, "s")[0] is None


def test_segment_names_depend_on_the_secret_and_the_run():
    a = LocalReduce.plan(_book(["a"] * 2, ["on"] * 2), 0, 0, 2, "on", False, 0, "s1")[0]["tag"]
    b = LocalReduce.plan(_book(["a"] * 2, ["on"] * 2), 0, 0, 2, "on", False, 0, "s2")[0]["tag"]
    book = _book(["a"] * 2, ["on"] * 2)
    book["job_id"] = "k"
    c = LocalReduce.plan(book, 0, 0, 2, "on", False, 0, "s1")[0]["tag"]
    assert len({a, b, c}) == 3
