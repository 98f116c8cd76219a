"""Two changes of an elastic job in a row (pushpull.cluster.scheduler): a change that comes while the servers
have not acknowledged the last one (so the workers have not been told of it) reaches the workers together
with it: the partitions both moved, the servers both lost or added, in one RESET. The scheduler's own
methods on its membership state, without its socket (what it would send is captured)."""
from __future__ import annotations

import json

from pushpull.cluster import nodes
from pushpull.cluster.scheduler import NodeInfo, Scheduler
from pushpull.transport.protocol import MsgType


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


def _taking_over(change: dict, worker_gen: int = 1, back=(0, 1)):
    """A scheduler taking the job over from 2 workers (still in generation ``worker_gen``, counting server 1 lost)
    and the servers ``back`` that applied generation 2, ``change`` (a replacement server came in as server 1)
    included, before the old scheduler could tell the workers. Server 0 holds tensor 1 (key 1 << 24); the change
    moved it to server 1 (:func:`_takeover`)."""
    sched, bodies, _ = _takeover([(0, 0, worker_gen), (1, 1, worker_gen)], [(i, 2, change) for i in back],
                                 servers_lost=[1])
    return sched, bodies


def test_a_change_the_servers_applied_before_the_scheduler_was_lost_is_made_again_with_its_moves():
    added = {"rank": 1, "host": "127.0.0.1", "port": 6}
    sched, bodies = _taking_over({"moved": {str(1 << 24): 1}, "servers_added": [added]})
    assert len(bodies) == 2 and bodies[0]["gen"] == 3
    assert bodies[0]["moved"] == {str(1 << 24): 1} and bodies[0]["servers_added"] == [added]
    assert sched.assigner.tensors["w"]["result"]["servers"] == [1]  # where later changes start from
    assert sched.assigner.load == [0, 400]


def test_without_a_change_in_flight_the_takeover_makes_no_moves():
    sched, bodies = _taking_over({}, worker_gen=1)
    assert bodies and bodies[0]["moved"] == {} and "servers_added" not in bodies[0]
    assert sched.assigner.tensors["w"]["result"]["servers"] == [0]


def test_the_change_is_not_made_again_when_every_node_had_it():
    _, bodies = _taking_over({"moved": {str(1 << 24): 1}}, worker_gen=2)
    assert bodies == []


def test_the_takeover_waits_for_a_replacement_server_the_workers_have_not_heard_of():
    """The workers count server 1 as lost (the change that took its replacement in never reached them); the
    servers' report of that change makes the new scheduler wait for the replacement rather than take the job over
    without it (which would then refuse it as a stranger)."""
    added = {"rank": 1, "host": "127.0.0.1", "port": 6}
    sched, bodies = _taking_over({"moved": {str(1 << 24): 1}, "servers_added": [added]}, back=(0,))
    assert sched.recovering and bodies == []
    sched._rejoined[b"s1"] = {"role": "server", "node_id": nodes.server_node(1), "host": "127.0.0.1", "port": 6,
                              "gen": 2, "job_id": "j", "max_key": 1, "change": {"servers_added": [added]}}
    sched._recovered(force=False)
    assert not sched.recovering and not sched.servers[1].dead


def _takeover(workers, servers, servers_lost=(), size_now=None):
    """A recovering scheduler (2 server slots) given the nodes that registered again: ``workers`` as (first rank,
    rank they report, generation), ``servers`` as (index, generation, last change applied); returns the
    scheduler, the RESET bodies sent to workers once the servers acknowledge, and the errors sent."""
    from types import SimpleNamespace

    sched = Scheduler.__new__(Scheduler)
    sched.gen, sched._reset_body, sched._reset_waiting = 0, {}, set()
    sched._joining, sched._join_queue, sched.barriers = [], [], {}
    sched.workers, sched.servers, sched.by_identity = {}, [], {}
    sched.num_servers, sched.num_workers, sched.job_id, sched.started = 2, 0, "j", 0.0
    sched.recovering, sched.ready = True, False
    sched.cfg = SimpleNamespace(min_workers=1, register_timeout=30.0, key_hash_fn="balanced", scheduler_recover=True)
    sent, errors = [], []
    sched._send = lambda node, header, frames=(): sent.append((node, header, frames))
    sched._error = lambda ident, text, key=0, recover=False: errors.append((ident, text))
    size = size_now if size_now is not None else len(workers)
    tensor = {"name": "w", "shape": [100], "dtype": "float32", "parts": [400], "key": 1, "servers": [0]}
    sched._rejoined = {
        **{f"w{first}".encode(): {"role": "worker", "node_id": now, "rank": first, "size": 3, "size_now": size,
                                  "gen": gen, "job_id": "j", "servers_lost": list(servers_lost), "tensors": [tensor]}
           for first, now, gen in workers},
        **{f"s{i}".encode(): {"role": "server", "node_id": nodes.server_node(i), "host": "127.0.0.1", "port": 5 + i,
                              "gen": gen, "job_id": "j", "max_key": 1, "change": change} for i, gen, change in servers},
    }
    sched._recovered(force=False)
    for s in sched.servers:
        if not s.dead:
            sched._reset_ack(s, sched.gen)
    bodies = [json.loads(bytes(f[0])) for node, h, f in sent
              if node in sched.workers.values() and h.type == MsgType.RESET]
    return sched, bodies, errors


def test_a_lost_server_change_in_flight_is_made_again_without_waiting_for_the_lost_server():
    """The servers applied 'server 1 lost, its partitions to server 0'; the workers had not heard of it, so they do
    not count server 1 as lost: the takeover must not wait out its deadline for it."""
    change = {"moved": {str(1 << 24): 0}, "lost_servers": [1], "ranks": {"0": 0, "1": 1}, "num_workers": 2}
    sched, bodies, _ = _takeover([(0, 0, 1), (1, 1, 1)], [(0, 2, change)])
    assert not sched.recovering and sched.servers[1].dead
    assert bodies and bodies[0]["lost_servers"] == [1] and bodies[0]["moved"] == {str(1 << 24): 0}


def test_a_worker_lost_in_a_change_in_flight_leaves_the_others_numbered_as_it_said():
    """Three workers, the one that started as rank 1 lost: rank 2 became 1, but the worker that did not hear of it
    still says 2, and another that did says 1: counted as the change numbered them, not one over the other."""
    change = {"ranks": {"0": 0, "2": 1}, "num_workers": 2}
    sched, bodies, _ = _takeover([(0, 0, 2), (2, 2, 1)], [(0, 2, change), (1, 2, change)], size_now=3)
    assert sorted(sched.workers) == [0, 1] and sched.workers[1].info["rank"] == 2 and sched.num_workers == 2
    assert bodies and bodies[0]["num_workers"] == 2


def test_a_worker_a_change_in_flight_took_in_registers_again_as_a_late_one():
    change = {"ranks": {"0": 0, "1": 1, "5": 2}, "num_workers": 3, "came_in": [2]}
    sched, bodies, _ = _takeover([(0, 0, 1), (1, 1, 1)], [(0, 2, change), (1, 2, change)], size_now=2)
    assert not sched.recovering and sched.num_workers == 2 and sorted(sched.workers) == [0, 1]


def test_a_server_whose_admission_never_reached_anyone_is_told_to_end():
    """The old scheduler answered a replacement server and died before the change that took it in went out: the
    workers count its index as lost and no server reports it added. Taken back as alive, it would be given
    partitions no worker can reach; it is told to end (the launcher starts it again, as a late server)."""
    sched, _, errors = _takeover([(0, 0, 1), (1, 1, 1)], [(0, 1, {}), (1, 0, {})], servers_lost=[1])
    assert not sched.recovering and sched.servers[1].dead
    assert [ident for ident, _ in errors] == [b"s1"]
