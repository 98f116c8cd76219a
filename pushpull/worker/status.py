"""What a worker asks its servers about its own tensors: which ranks a round still waits for, the pushes
backup workers' rounds dropped, how many rounds completed ahead of this worker.

Why apart from the engine: these are questions (a blocking STATUS exchange per partition, 1 s at most
each), asked at a deadline or by the backup-worker logic; the engine's job is moving tensors.
"""
from __future__ import annotations

import zmq

from pushpull.transport.protocol import Header, MsgType, decode_json
from pushpull.worker.handle import PushPullError
from pushpull.worker.table import INITING, READY, Entry, Op


class StatusQueries:
    """``Engine.status``: the engine's tensors as its servers see them."""

    def __init__(self, engine):
        self.eng = engine

    def _ask(self, p, rnd: int) -> dict:
        """One STATUS exchange with partition ``p``'s server about round ``rnd`` (1 s at most)."""
        eng = self.eng
        header = Header(MsgType.STATUS, sender=eng.rank, key=p.key, round=rnd, gen=eng.gen)
        body = eng.direct.exchange(p.sock, header, None, 1.0, lambda: eng.member.failure, want=MsgType.STATUS_RESP)
        return decode_json(bytes(body))

    def describe(self, op: Op) -> str:
        """What a timed-out op waits for, with the ranks the servers have not heard from (asked now)."""
        eng = self.eng
        e = op.entry
        if e.state is INITING:
            return self.missing_ranks(e, [p for p in e.parts if not p.inited], op.round)
        if e.state is not READY:
            return f"the tensor is still being set up ({e.state.value}); is every worker calling push_pull on it?"
        waiting = [p for p in e.parts if eng.kv.inflight.get(p.key) is op]
        servers = sorted({p.server for p in waiting})
        return (f"{len(waiting)} of {len(e.parts)} partition(s) of round {op.round} outstanding on server(s) "
                f"{servers}; {self.missing_ranks(e, waiting, op.round)}")

    def missing_ranks(self, e: Entry, parts: list, rnd: int, limit: int = 4) -> str:
        """Ask the servers of (up to ``limit`` of) ``parts`` which ranks they have not heard from for round
        ``rnd`` (or for the INIT, while it is pending), and say it; 1 s per server at most."""
        found: dict[str, set] = {}
        for p in parts[:limit]:
            try:
                d = self._ask(p, rnd)
            except (TimeoutError, ConnectionError, RuntimeError, zmq.ZMQError, ValueError, AttributeError):
                continue
            found.setdefault(d.get("stage", "?"), set()).update(d.get("missing", []))
        if not found:
            return "the servers did not say which ranks are missing; a slow or missing worker keeps the round open"
        return "; ".join(f"rank(s) {sorted(missing)} have not {stage} yet" for stage, missing in found.items())

    def late_pushes(self) -> dict[int, int]:
        """Backup workers: pushes the servers dropped because their round had completed, per rank, over every
        partition of every backup key (asked through STATUS, 1 s per partition at most; ``partitions`` counts
        those that answered)."""
        total: dict[int, int] = {}
        for e in list(self.eng.table.entries.values()):
            if not any(k == "backup_workers" for k, _ in e.spec.meta):
                continue
            for p in e.parts:
                try:
                    dropped = self._ask(p, e.round).get("dropped") or {}
                except (TimeoutError, ConnectionError, RuntimeError, zmq.ZMQError, ValueError) as ex:
                    raise PushPullError(f"tensor {e.name!r}: server {p.server} did not say its late pushes: "
                                        f"{ex}") from None
                for rank, count in dropped.items():
                    total[int(rank)] = total.get(int(rank), 0) + int(count)
        return total

    def rounds_behind(self) -> int:
        """Backup workers: how many rounds of every backup key have completed on the servers beyond this
        worker's own (as of their last answers): rounds it can catch up on by pulling their sums."""
        eng = self.eng
        behind = None
        for e in list(eng.table.entries.values()):
            if e.busy or not e.parts or not any(k == "backup_workers" for k, _ in e.spec.meta):
                continue
            ahead = min(p.completed for p in e.parts) - e.round
            behind = ahead if behind is None else min(behind, ahead)
        return max(0, behind or 0)
