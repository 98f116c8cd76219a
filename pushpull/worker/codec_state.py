"""An elastic commit's copy of the compression state, and its load after a change (docs/elastic.md).

Why: after a change of the job, ``elastic.run`` goes back to the last commit and the steps since are taken again.
A codec with state carries those steps in it: error feedback's residual, Nesterov momentum folded in before
compressing, a random stream's position; on the servers, the error feedback of the compressed sums. Left as they
were, a replayed step's momentum and residual would count twice, and a key that moved off a lost server would
lose its server's residual. So a commit keeps them, and a restore puts them back:

* the worker's own codecs (every compressed partition): a copy in memory, like the model's;
* the servers' (each compressed partition's sum): read at the commit (CODEC_STATE, STATE_READ) by two workers
  each, and loaded back (STATE_WRITE) by each of those still in the job. A server drops its residuals at a
  change, so a partition whose two holders both left starts again from zero, as it would on a new server.
"""
from __future__ import annotations

import logging

import torch

from pushpull.cluster.assign import PART_BITS
from pushpull.transport.protocol import STATE_READ, STATE_WRITE, Header, MsgType
from pushpull.worker.handle import PushPullError, WorkersChanged

log = logging.getLogger(__name__)


def holds(key: int, rank: int, size: int) -> bool:
    """Whether ``rank`` keeps a copy of partition ``key``'s server state: ranks (tensor + partition) mod size and
    the one after it. Why from the key alone: every worker decides the same without agreeing on a list."""
    first = ((key >> PART_BITS) + (key & ((1 << PART_BITS) - 1))) % size
    return rank == first or rank == (first + 1) % size


def _compressed(engine) -> list:
    """(entry, partition) of every compressed partition declared here, by key."""
    return [ep for _, ep in sorted(engine.kv.parts.items()) if ep[1].codec is not None]


def _clone(state: dict) -> dict:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def commit(engine, commit_id: int) -> dict:
    """The compression state now (every worker between steps, as a commit is): this worker's codecs, and the
    servers' of the partitions it holds (``holds``). ``commit_id`` orders copies: the newest loaded wins."""
    workers, servers = {}, {}
    rank, size = engine.rank, engine.size
    for e, p in _compressed(engine):
        workers[p.key] = _clone(p.codec.chain.state_dict())
        if e.spec.op == "sum" and p.inited and holds(p.key, rank, size):
            servers[p.key] = bytes(_exchange(engine, e, p, STATE_READ, e.round, None, 0))
    return {"commit": commit_id, "workers": workers, "servers": servers}


def restore(engine, kept: dict | None) -> None:
    """This worker's codecs back to a :func:`commit`'s state (None: fresh, the state before any commit)."""
    workers = kept["workers"] if kept is not None else {}
    for _, p in _compressed(engine):
        state = workers.get(p.key)
        if state is None:  # declared after the commit: as it was then, fresh
            p.codec.chain.reset()
        else:
            p.codec.chain.load_state_dict(state)


def load_servers(engine, kept: dict | None) -> None:
    """Load the servers' state of the partitions this worker holds copies of, as of a :func:`commit` (after a change
    the servers dropped theirs). Every worker must do it before its next step (``elastic.run``'s sync does, before
    its broadcast: nobody steps before every load is in)."""
    if kept is None:
        return
    parts = dict(engine.kv.parts)
    for key, body in kept["servers"].items():
        ep = parts.get(key)
        if ep is not None:
            _exchange(engine, ep[0], ep[1], STATE_WRITE, 0, body, kept["commit"])


def _exchange(engine, e, p, step: int, rnd: int, body, commit_id: int):
    """One CODEC_STATE request to ``p``'s server on the caller's thread (the direct path), its answer's body."""
    gen = engine.gen
    header = Header(MsgType.CODEC_STATE, sender=engine.rank, key=p.key, round=rnd, gen=gen, numel=step,
                    extra=max(commit_id, 0))
    what = "reading" if step == STATE_READ else "loading"
    try:
        return engine.direct.exchange(p.sock, header, body, engine.cfg.timeout,
                                      lambda: engine.member.failure or (None if engine.gen == gen
                                                                        else "the workers changed"),
                                      want=MsgType.CODEC_STATE)
    except TimeoutError:
        raise PushPullError(f"tensor {e.name!r}: {what} the compression state of partition {p.index} on server "
                            f"{p.server}: no answer within {engine.cfg.timeout:.0f}s (PUSHPULL_TIMEOUT)") from None
    except ConnectionError as ex:
        if engine.gen != gen:
            raise WorkersChanged(f"tensor {e.name!r}: {engine.changed_reason}") from None
        raise PushPullError(f"tensor {e.name!r}: {what} its compression state: {ex}") from None
    except RuntimeError as ex:  # the server's error
        raise PushPullError(f"tensor {e.name!r}: {what} the compression state of partition {p.index}: {ex}") \
            from None
