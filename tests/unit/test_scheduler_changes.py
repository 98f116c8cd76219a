"""Two changes of an elastic job in a row (pushpull.cluster.scheduler): a change that comes while the servers
have not acknowledged the last one (so the workers have not been told of it) reaches the workers together
with it: the partitions both moved, the servers both lost or added, in one RESET. The scheduler's own
methods on its membership state, without its socket (what it would send is captured)."""
from __future__ import annotations

import json

from pushpull.cluster import nodes
from pushpull.cluster.scheduler import NodeInfo, Scheduler


def _scheduler():
    sched = Scheduler.__new__(Scheduler)  # no socket: the membership state the methods below use
    sched.gen, sched._reset_body, sched._reset_waiting = 0, {}, set()
    sched._joining, sched._join_queue, sched.barriers = [], [], {}
    sent = []
    sched._send = lambda node, header, frames=(): sent.append((node, header, frames))
    sched.workers = {r: NodeInfo(f"w{r}".encode(), "worker", r, {"rank": r}) for r in range(2)}
    sched.num_workers = 2
    sched.servers = [NodeInfo(f"s{i}".encode(), "server", nodes.server_node(i), {"host": "127.0.0.1", "port": 1})
                     for i in range(2)]
    return sched, sent


def test_a_change_before_the_last_was_acknowledged_carries_both():
    sched, sent = _scheduler()
    sched._new_generation("server 1 failed", {11: 0, 12: 0}, {"lost_servers": [1]})
    sched._new_generation("a replacement server came in as server 1", {12: 1}, {"servers_added": [{"rank": 1}]})
    for s in sched.servers:  # both servers acknowledge the second change
        sched._reset_ack(s, sched.gen)
    to_workers = [json.loads(bytes(f[0])) for node, h, f in sent if node in sched.workers.values()]
    assert len(to_workers) == 2  # one RESET per worker, the second change's
    body = to_workers[0]
    assert body["gen"] == 2 and body["moved"] == {"11": 0, "12": 1}
    assert body["lost_servers"] == [1] and body["servers_added"] == [{"rank": 1}]
    assert "server 1 failed" in body["lost"] and "replacement" in body["lost"]


def test_a_change_after_the_workers_were_told_stands_alone():
    sched, sent = _scheduler()
    sched._new_generation("server 1 failed", {11: 0}, {"lost_servers": [1]})
    for s in sched.servers:
        sched._reset_ack(s, sched.gen)
    sched._new_generation("a replacement server came in as server 1", {11: 1}, {"servers_added": [{"rank": 1}]})
    for s in sched.servers:
        sched._reset_ack(s, sched.gen)
    bodies = [json.loads(bytes(f[0])) for node, h, f in sent if node in sched.workers.values()]
    assert [b["gen"] for b in bodies] == [1, 1, 2, 2]
    assert bodies[-1]["moved"] == {"11": 1} and "lost_servers" not in bodies[-1]
