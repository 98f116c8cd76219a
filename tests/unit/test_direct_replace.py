"""A lost server's replacement (elastic training): the direct path's per-thread connections to it are
dropped and opened again to the new address (pushpull.worker.direct.DirectPath.replace), without a socket."""
from __future__ import annotations

from pushpull.worker.direct import DirectPath


class _Conn:
    closed = False

    def close(self, *a):
        self.closed = True


def _path() -> DirectPath:
    return DirectPath(ctx=None, rank=0, servers={"s1": "tcp://10.0.0.1:5000"}, lanes={"s1": "10.0.0.1:5001"})


def test_a_connection_opened_before_a_replacement_is_closed_and_forgotten():
    path, old = _path(), _Conn()
    held = {"s1": (0, old)}
    path._open.append(old)
    path.replace("s1", "tcp://10.0.0.2:6000", "10.0.0.2:6001")
    assert path._fresh(held, "s1") is None and old.closed and held == {} and old not in path._open
    assert path.servers["s1"] == "tcp://10.0.0.2:6000" and path.lanes["s1"] == "10.0.0.2:6001"


def test_a_connection_opened_after_the_replacement_is_kept():
    path, new = _path(), _Conn()
    path.replace("s1", "tcp://10.0.0.2:6000", None)
    held = {"s1": (1, new)}
    assert path._fresh(held, "s1") is new and not new.closed


def test_a_replacement_without_a_lane_forgets_the_old_lane_and_a_failed_one():
    path = _path()
    path._no_lane.add("s1")
    path.replace("s1", "tcp://10.0.0.2:6000", None)
    assert "s1" not in path.lanes and "s1" not in path._no_lane
