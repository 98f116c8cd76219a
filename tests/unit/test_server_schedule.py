"""BYTEPS_SERVER_ENABLE_SCHEDULE: the order in which a server's engine thread serves what is queued for it
(pushpull.server.server.scheduled); the cluster half (exact sums with it on) is in
tests/cluster/test_pushpull.py."""
from __future__ import annotations

import queue

import numpy as np

from pushpull.server.keystate import KeyState
from pushpull.server.server import scheduled


def _key(key: int, pushes: int) -> KeyState:
    ks = KeyState(key, f"t{key}", "float32", 4, num_workers=2)
    ks.pushes = pushes
    return ks


def test_keys_with_fewer_pushes_are_served_first():
    ahead, behind = _key(1, 6), _key(2, 1)
    q = queue.SimpleQueue()
    order, stop = scheduled([(b"w0", "push-ahead", ahead), (b"w0", "push-behind", behind)], q)
    assert [m for _, m, _ in order] == ["push-behind", "push-ahead"] and not stop


def test_a_keys_requests_keep_their_arrival_order():
    a, b = _key(1, 3), _key(2, 0)
    items = [(b"w0", "a-push", a), (b"w1", "b-push", b), (b"w0", "a-pull", a), (b"w1", "b-pull", b)]
    order, _ = scheduled(items, queue.SimpleQueue())
    assert [m for _, m, _ in order] == ["b-push", "b-pull", "a-push", "a-pull"]


def test_everything_queued_is_ordered_together_and_the_stop_marker_is_reported():
    ahead, behind = _key(1, 4), _key(2, 2)
    q = queue.SimpleQueue()
    q.put([(b"w1", "later-behind", behind)])
    q.put(None)
    order, stop = scheduled([(b"w0", "first-ahead", ahead)], q)
    assert [m for _, m, _ in order] == ["later-behind", "first-ahead"] and stop


def test_a_push_counts_and_a_reset_clears_the_count():
    ks = KeyState(7, "t", "float32", 4, num_workers=2)
    ks.push(1, 0, np.ones(4, np.float32))
    ks.push(1, 1, np.ones(4, np.float32))
    assert ks.pushes == 2
    ks.reset(2)
    assert ks.pushes == 0
