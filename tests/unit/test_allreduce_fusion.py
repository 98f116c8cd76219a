"""Tensor fusion's grouping in the all-reduce backend (:func:`pushpull.torch.allreduce_backend.fuse_groups`):
which partitions of rank 0's batch share one collective. The reductions themselves, over real processes:
tests/cluster/test_strategies.py."""
from __future__ import annotations

from pushpull.torch.allreduce_backend import fuse_groups, split_part

F32, F64 = 3, 4   # dtype codes (pushpull.dtypes headers)


def test_small_partitions_of_one_dtype_share_a_collective():
    assert fuse_groups([(10, 4, F32), (20, 4, F32), (30, 4, F32)], part_bytes=1024, max_bytes=4096) == [[0, 1, 2]]


def test_a_large_partition_is_reduced_alone_and_splits_the_run_around_it():
    items = [(10, 4, F32), (1000, 4, F32), (10, 4, F32), (10, 4, F32)]
    assert fuse_groups(items, part_bytes=1024, max_bytes=4096) == [[0], [1], [2, 3]]


def test_a_change_of_dtype_starts_a_new_collective():
    items = [(10, 4, F32), (10, 8, F64), (10, 8, F64), (10, 4, F32)]
    assert fuse_groups(items, part_bytes=1024, max_bytes=4096) == [[0], [1, 2], [3]]


def test_a_fused_collective_holds_at_most_max_bytes():
    items = [(200, 4, F32)] * 5   # 800 bytes each
    assert fuse_groups(items, part_bytes=1024, max_bytes=2000) == [[0, 1], [2, 3], [4]]


def test_rank_0_order_is_kept():
    items = [(i + 1, 4, F32 if i % 3 else F64) for i in range(12)]
    groups = fuse_groups(items, part_bytes=1024, max_bytes=4096)
    assert [i for g in groups for i in g] == list(range(12))


# ---------------------------------------------------------------- a large partition in pieces (split_part) --

def _part(n: int, off: int = 0, ok: bool = True):
    import torch

    t = torch.arange(off + n, dtype=torch.float32)
    return t, ("entry", off, n, n * 4, t[off:off + n], ok)


def test_a_partition_within_the_limit_stays_whole():
    _, p = _part(1000)
    assert split_part(p, max_bytes=4000) == [p]


def test_a_larger_partition_is_cut_into_contiguous_pieces_that_cover_it_once():
    _, p = _part(1000, off=50)
    pieces = split_part(p, max_bytes=1200)  # 4000 bytes -> 4 pieces of 250 elements
    assert [(q[1], q[2], q[3]) for q in pieces] == [(50, 250, 1000), (300, 250, 1000), (550, 250, 1000),
                                                   (800, 250, 1000)]


def test_pieces_are_views_so_their_sums_land_in_the_tensor():
    t, p = _part(1000)
    for q in split_part(p, max_bytes=1200):
        q[4].mul_(2)
    assert t.tolist() == [2.0 * i for i in range(1000)]


def test_an_uneven_partition_ends_with_a_shorter_piece_and_keeps_its_flag():
    _, p = _part(1001, ok=False)
    pieces = split_part(p, max_bytes=1200)
    assert [q[2] for q in pieces] == [251, 251, 251, 248]
    assert sum(q[3] for q in pieces) == 1001 * 4 and not any(q[5] for q in pieces)
