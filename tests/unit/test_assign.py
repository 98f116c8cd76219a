"""Tensor -> key and partition -> server assignment (the scheduler's Assigner)."""
import random

from pushpull.cluster.assign import Assigner
from pushpull.profiles import load_profile

P = 4096000


def _declare(a, sizes, order, rank=0):
    out = {}
    for i in order:
        nb = sizes[i]
        parts = [min(P, nb - o) for o in range(0, nb, P)]
        out[i] = a.assign(rank, {"name": f"t{i}", "shape": [nb // 4], "dtype": "float32", "parts": parts})
    return out


def test_resnet50_partitions_are_balanced_over_servers():
    sizes = [t.numel * 4 for t in load_profile("resnet50").tensors()]
    for k in (2, 3, 4):
        a = Assigner(k, "balanced")
        _declare(a, sizes, range(len(sizes)))
        assert a.imbalance() < 0.06, (k, a.load)
        hashed = Assigner(k, "djb2")
        _declare(hashed, sizes, range(len(sizes)))
        assert a.imbalance() < hashed.imbalance()


def test_keys_do_not_depend_on_the_order_a_later_worker_declares_in():
    sizes = [random.Random(1).randint(4, 10_000_000) // 4 * 4 for _ in range(50)]
    a = Assigner(3)
    first = _declare(a, sizes, range(50), rank=0)
    order = list(range(50))
    random.Random(2).shuffle(order)
    second = _declare(a, sizes, order, rank=1)
    assert first == second


def test_disagreement_names_tensor_and_both_ranks():
    a = Assigner(2)
    a.assign(0, {"name": "fc.weight", "shape": [10, 4], "dtype": "float32", "parts": [160]})
    r = a.assign(3, {"name": "fc.weight", "shape": [4, 10], "dtype": "float32", "parts": [160]})
    assert "fc.weight" in r["error"] and "rank 0" in r["error"] and "rank 3" in r["error"]


def test_disagreement_is_repeated_to_a_late_declarer():
    """A worker that declares a tensor only after two others disagreed on it gets the
    same error (it would otherwise be assigned a key whose INIT never completes)."""
    a = Assigner(2)
    req = {"name": "w", "shape": [12], "dtype": "float32", "parts": [48]}
    assert "key" in a.assign(2, req)
    first = a.assign(0, dict(req, shape=[10], parts=[40]))
    assert "differs across workers" in first["error"] and not first.get("repeat")
    late = a.assign(1, req)  # agrees with rank 2, but the tensor is already broken
    assert late["error"] == first["error"] and late["repeat"]


def _req(name: str, writers=None) -> dict:
    d = {"name": name, "shape": [4], "dtype": "float32", "parts": [16]}
    if writers is not None:
        d["writers"] = writers
    return d


def test_slices_declared_by_their_writers_are_not_misnamed():
    # 2 machines x 2 processes: slice j of a tensor is declared by local rank j of each machine only
    a = Assigner(2)
    for r in (0, 2):
        a.assign(r, _req("w#local0of2", [0, 2]))
    for r in (1, 3):
        a.assign(r, _req("w#local1of2", [1, 3]))
    assert a.misnamed(4, after_s=0.0) == []
    # a machine that is late with its slices is late, not misnamed
    b = Assigner(2)
    b.assign(0, _req("v#local0of2", [0, 2]))
    b.assign(1, _req("v#local1of2", [1, 3]))
    assert b.misnamed(4, after_s=0.0) == []
    # whole tensors named differently are still caught
    c = Assigner(2)
    c.assign(0, _req("x"))
    c.assign(1, _req("x"))
    c.assign(2, _req("y"))
    c.assign(3, _req("y"))
    assert [(n1, sorted(r1), n2, sorted(r2)) for n1, r1, n2, r2 in c.misnamed(4, after_s=0.0)] == \
        [("x", [0, 1], "y", [2, 3])]


def test_tensors_declared_before_a_worker_came_in_are_no_evidence_of_misnaming():
    """A newcomer declares its first tensor (a welcome) while the others' old tensors lack its declaration:
    they are declared later or never by it, not misnamed (a DiLoCo round can take minutes to come)."""
    import time

    a = Assigner(2)
    for r in (0, 1, 2):
        a.assign(r, _req("old"))
    a.fresh_since = time.monotonic()  # rank 3 came into the running job
    a.assign(3, _req("welcome"))
    assert a.misnamed(4, after_s=0.0) == []
    for r in (0, 1):
        a.assign(r, _req("new.a"))
    a.assign(2, _req("new.b"))  # names that differ after the join are still caught
    assert [(x, y) for x, _, y, _ in a.misnamed(4, after_s=0.0)] != []
