"""Tensor fusion's grouping in the all-reduce backend (:func:`pushpull.torch.allreduce_backend.fuse_groups`):
which partitions of rank 0's batch share one collective. The reductions themselves, over real processes:
tests/cluster/test_strategies.py."""
from __future__ import annotations

from pushpull.torch.allreduce_backend import fuse_groups

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
