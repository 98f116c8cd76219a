"""An elastic commit's copy of the compression state, and its load after a change (docs/elastic.md).

Why: after a change of the job, ``elastic.run`` goes back to the last commit and the steps since are taken again.
A codec with state carries those steps in it: error feedback's residual, Nesterov momentum folded in before
compressing, a random stream's position; on the servers, the error feedback of the compressed sums. Left as they
were, a replayed step's momentum and residual would count twice, and a key that moved off a lost server would
lose its server's residual. So a commit keeps them, and a restore puts them back:

* the worker's own codecs (every compressed partition): a copy in memory, like the model's;
* the servers' (each compressed partition's sum): at the commit, each server keeps a copy of its own in memory and
  one worker (:func:`holds`) reads it (CODEC_STATE, STATE_READ). After a change every worker asks each server to go
  back to its own copy (STATE_WRITE, empty), and the holder sends its copy too (STATE_WRITE): a lost worker's
  partitions come back from their servers, a lost server's from their holders. Only a server and the holder of one
  of its partitions lost together lose that partition's residual (it starts again from zero, as on a new server).
  One copy off the server, not two: a commit reads 1/n of the compressed tensors' residuals per worker.
"""
from __future__ import annotations

import functools
import json
import time

import torch
import zmq

from pushpull.cluster.assign import PART_BITS
from pushpull.compression import build_server
from pushpull.transport.protocol import (
    STATE_READ, STATE_WRITE, Header, MsgType, decode_json, messages,
)
from pushpull.worker.direct import LIVENESS_S
from pushpull.worker.handle import PushPullError, WorkersChanged


def holds(key: int, rank: int, size: int) -> bool:
    """Whether ``rank`` keeps the copy of partition ``key``'s server state: rank (tensor + partition) mod size. Why
    from the key alone: every worker decides the same without agreeing on a list, and a tensor's partitions spread
    over the ranks."""
    return ((key >> PART_BITS) + (key & ((1 << PART_BITS) - 1))) % size == rank


def _compressed(engine) -> list:
    """(entry, partition) of every compressed partition declared here, by key."""
    return [ep for _, ep in sorted(engine.kv.parts.items()) if ep[1].codec is not None]


@functools.lru_cache(maxsize=64)
def _chain_has_state(spec_json: str) -> bool:
    return bool(build_server(json.loads(spec_json)).state_dict())


def _on_servers(engine, e) -> bool:
    """Whether the servers keep state for this tensor's sums that a lost node would take with it: an elastic job's
    (only there is a server lost and the job goes on), a sum's (an outer key answers whole parameters), and a
    server chain with state (error feedback, a random stream; not the identity codec under worker momentum)."""
    return (engine.table.keep_seeds and e.spec.op == "sum"
            and _chain_has_state(json.dumps(e.compression, sort_keys=True)))


def _clone(state: dict) -> dict:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def commit(engine, commit_id: int, prev: dict | None = None) -> dict:
    """The compression state now (every worker between steps, as a commit is): this worker's codecs, and the
    servers' of the partitions it holds (every server keeps its own copy of this commit too). ``commit_id`` orders
    copies: the newest loaded wins. A partition not declared on its server since a change (it moved, and no step
    used it since) has had no round since the restore: its copy of the commit before (``prev``) is still exact and
    is carried over by every worker that has one."""
    workers, reads, servers = {}, [], {}
    rank, size = engine.rank, engine.size
    before = prev["servers"] if prev is not None else {}
    for e, p in _compressed(engine):
        with p.codec.lock:
            workers[p.key] = _clone(p.codec.chain.state_dict())
        if not _on_servers(engine, e):
            continue
        if p.inited:
            if holds(p.key, rank, size):
                reads.append((e, p, STATE_READ, e.round, None))
        elif p.key in before:
            servers[p.key] = before[p.key]
    for (_, p, *_), body in zip(reads, _requests(engine, reads, commit_id)):
        servers[p.key] = bytes(body)
    return {"commit": commit_id, "workers": workers, "servers": servers}


def restore(engine, kept: dict | None) -> None:
    """This worker's codecs back to a :func:`commit`'s state (None: fresh, the state before any commit). A codec
    pool thread still compressing a push of before the change finishes first (the codec's lock); one that starts
    after it finds the change and compresses nothing (WorkerCodec.compress)."""
    workers = kept["workers"] if kept is not None else {}
    for _, p in _compressed(engine):
        state = workers.get(p.key)
        with p.codec.lock:
            if state is None:  # declared after the commit: as it was then, fresh
                p.codec.chain.reset()
            else:
                p.codec.chain.load_state_dict(state)


def load_servers(engine, kept: dict | None) -> None:
    """The servers back to a :func:`commit`'s state (module docstring): to their own copy, and the holder's copies.
    Every worker must do it before its next step (``elastic.run``'s sync does, before its broadcast: nobody steps
    before every load is in). Only partitions declared on their server, or moved there by the change (it keeps a
    worker's copy until they are declared)."""
    if kept is None:
        return
    writes = [(e, p, STATE_WRITE, 0, kept["servers"].get(p.key, b"")) for e, p in _compressed(engine)
              if (p.inited or p.moved) and _on_servers(engine, e)]
    _requests(engine, writes, kept["commit"], every=True)


WINDOW = 64  # requests in flight at once: every server's link busy, far below a socket's high-water mark


def _requests(engine, reqs: list, commit_id: int, every: bool = False) -> list:
    """CODEC_STATE requests (entry, partition, step, round, body) sent on the caller's thread over the direct path's
    sockets, WINDOW at a time, so that every server's link carries its share at the same time; the answers' bodies
    in the same order. Raises WorkersChanged when the job changes meanwhile, PushPullError on a server's error (with
    ``every``: once every request is answered, naming each refused one: a load refused for one key leaves the others
    to load) or when no answer came for PUSHPULL_TIMEOUT, naming the tensor."""
    if not reqs:
        return []
    gen, direct, timeout = engine.gen, engine.direct, engine.cfg.timeout
    out: list = [None] * len(reqs)
    refused: list[str] = []
    waiting: dict[tuple[str, int], int] = {}
    poller, by_socket = zmq.Poller(), {}
    todo = list(range(len(reqs) - 1, -1, -1))  # a stack: the next request is the last

    def send_next() -> None:
        while todo and len(waiting) < WINDOW:
            i = todo[-1]
            e, p, step, rnd, body = reqs[i]
            s = direct._socket(p.sock)
            if s not in by_socket:
                by_socket[s] = p.sock
                poller.register(s, zmq.POLLIN)
            header = Header(MsgType.CODEC_STATE, sender=engine.rank, key=p.key, round=rnd, gen=gen, numel=step,
                            extra=max(commit_id, 0))
            try:
                s.send_multipart([header.pack()] + ([body] if body is not None else []), flags=zmq.NOBLOCK,
                                 copy=False)
            except zmq.Again:  # the socket is full (its server gone?): the liveness checks below say why
                return
            todo.pop()
            waiting[(p.sock, p.key)] = i

    send_next()
    deadline = time.monotonic() + timeout
    while waiting or todo:
        ready = dict(poller.poll(int(LIVENESS_S * 1000)))
        for s in ready:
            for m in messages(s.recv_multipart(copy=False)):
                h = m.header
                i = waiting.get((by_socket[s], h.key))
                if i is None or h.gen != gen or h.type not in (MsgType.CODEC_STATE, MsgType.ERROR):
                    continue  # a late answer to an earlier call on this thread's socket
                e, p, step, rnd, _ = reqs[i]
                if h.type == MsgType.CODEC_STATE and (h.numel != step or h.round != rnd):
                    continue  # an answer to another request for the key (an earlier call's, late)
                del waiting[(by_socket[s], h.key)]
                if h.type == MsgType.ERROR:
                    text = decode_json(m.body()).get("error", "unknown server error")
                    refused.append(f"tensor {e.name!r}: {_what(step)} the compression state of partition "
                                   f"{p.index} on server {p.server}: {text}")
                    if not every:
                        raise PushPullError(refused[0])
                    continue
                out[i] = m.body_view()
                deadline = time.monotonic() + timeout  # a deadline per answer: a large model's copy takes a while
        send_next()
        if not ready or time.monotonic() > deadline:
            reason = engine.member.failure
            if reason:
                raise PushPullError(f"compression state: {reason}")
            if engine.gen != gen:
                raise WorkersChanged(f"compression state: {engine.changed_reason}")
            if time.monotonic() > deadline:
                e, p, step, *_ = reqs[next(iter(waiting.values()), todo[-1] if todo else 0)]
                raise PushPullError(f"tensor {e.name!r}: {_what(step)} the compression state of partition {p.index}: "
                                    f"server {p.server} did not answer within {timeout:.0f}s (PUSHPULL_TIMEOUT)")
    if refused:
        raise PushPullError("; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else ""))
    return out


def _what(step: int) -> str:
    return "reading" if step == STATE_READ else "loading"
