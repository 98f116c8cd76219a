"""Tensor name -> key and partition -> server, decided once by the scheduler.

Deciding centrally makes keys identical on every worker whatever order they
declare tensors in, lets the 'balanced' policy place partitions on the least
loaded server by bytes (hashing leaves servers unevenly loaded), and lets the
first disagreement about a tensor's shape or dtype be reported to every worker.
"""
from __future__ import annotations

import time

PART_BITS = 24  # key = tensor_id << PART_BITS | partition index


def part_key(tensor_key: int, part: int) -> int:
    return (tensor_key << PART_BITS) | part


def part_index(key: int) -> int:
    """The partition index of a key made by :func:`part_key`."""
    return key & ((1 << PART_BITS) - 1)


def _djb2(s: str) -> int:
    h = 5381
    for c in s.encode():
        h = ((h << 5) + h + c) & 0xFFFFFFFFFFFFFFFF
    return h


def _sdbm(s: str) -> int:
    h = 0
    for c in s.encode():
        h = (c + (h << 6) + (h << 16) - h) & 0xFFFFFFFFFFFFFFFF
    return h


HASHES = {
    "djb2": _djb2,
    "sdbm": _sdbm,
    "naive": lambda s: int(s),
    "built_in": lambda s: int(s) * 2654435761 & 0xFFFFFFFF,
}


class Assigner:
    def __init__(self, num_servers: int, policy: str = "balanced"):
        self.num_servers = num_servers
        self.policy = policy
        self.load = [0] * num_servers
        self.tensors: dict[str, dict] = {}
        self.dead: set[int] = set()  # servers lost (elastic): nothing is assigned to them any more
        self.homes: dict[int, int] = {}  # partition key -> the lost server it moved away from (add_server)
        self.next_key = 1  # a new tensor's key (never one a server may still hold)
        # a worker came into the running job then: the tensors declared before it are not its to declare yet
        # (it syncs first), so they are no evidence of workers naming tensors differently
        self.fresh_since = 0.0

    def _alive(self) -> list[int]:
        return [j for j in range(self.num_servers) if j not in self.dead]

    def remove_server(self, lost: int) -> dict[int, int]:
        """Move every partition of server ``lost`` to the least loaded live server (elastic training);
        returns {partition key: new server}, which every worker applies the same way."""
        self.dead.add(lost)
        moved: dict[int, int] = {}
        for t in self.tensors.values():
            if "result" not in t:
                continue
            res = t["result"]
            for i, srv in enumerate(res["servers"]):
                if srv == lost:
                    new = min(self._alive(), key=lambda j: (self.load[j], j))
                    self.load[new] += t["decl"]["parts"][i]
                    res["servers"][i] = new
                    moved[part_key(res["key"], i)] = new
                    self.homes.setdefault(part_key(res["key"], i), lost)
        self.load[lost] = 0
        return moved

    def add_server(self, index: int) -> dict[int, int]:
        """A replacement takes lost server ``index``'s place: it is assigned to again, and the partitions that
        moved away from ``index`` when it was lost move back (the placement of before the loss), but for those
        of keys whose server holds state beyond a round, which stay where it is exact; where that is
        not known (a scheduler that took the job over since), partitions move to it from the most loaded
        servers, the largest first, while that brings it nearer the mean load. Returns {partition key:
        ``index``}, which every worker applies the same way."""
        self.dead.discard(index)
        self.load[index] = 0
        where = {}  # partition key -> (its size, the result holding its server)
        for t in self.tensors.values():
            # a key whose server holds state beyond a round (DiLoCo's outer optimizer, asynchronous training's
            # parameters) stays: moving it would trade the server's exact state for the workers' seed
            if "result" in t and not t.get("keeps_state"):
                res = t["result"]
                for i, nbytes in enumerate(t["decl"]["parts"]):
                    where[part_key(res["key"], i)] = (nbytes, res, i)
        homes = [k for k, home in self.homes.items() if home == index and k in where]
        if not homes:
            load = list(self.load)  # as it would be after each move
            target = sum(load) / len(self._alive())
            for k, (nbytes, res, i) in sorted(where.items(), key=lambda kv: -kv[1][0]):
                src = res["servers"][i]
                if src != index and load[src] - nbytes >= target and load[index] + nbytes / 2 <= target:
                    homes.append(k)
                    load[src] -= nbytes
                    load[index] += nbytes
        moved: dict[int, int] = {}
        for k in homes:
            nbytes, res, i = where[k]
            self.load[res["servers"][i]] -= nbytes
            self.load[index] += nbytes
            res["servers"][i] = index
            moved[k] = index
            self.homes.pop(k, None)
        return moved

    def apply_moves(self, moved: dict[int, int]) -> None:
        """Partitions a change moved ({partition key: server}) that the placements here do not show yet: a change
        the servers applied before the scheduler that made it was lost (Scheduler._change_in_flight)."""
        for t in self.tensors.values():
            res = t.get("result")
            if res is None:
                continue
            for i, nbytes in enumerate(t["decl"]["parts"]):
                to = moved.get(part_key(res["key"], i))
                if to is not None and 0 <= to < self.num_servers and to != res["servers"][i]:
                    if 0 <= res["servers"][i] < self.num_servers:
                        self.load[res["servers"][i]] -= nbytes
                    self.load[to] += nbytes
                    res["servers"][i] = to

    def assign(self, rank: int, req: dict) -> dict:
        name = str(req["name"])
        decl = {"shape": list(req["shape"]), "dtype": str(req["dtype"]), "parts": [int(p) for p in req["parts"]]}
        known = self.tensors.get(name)
        if known is not None:
            known["ranks"].add(rank)
            if "error" in known:  # a worker that declares it after the disagreement learns of it too
                return {"error": known["error"], "repeat": True}
            if known["decl"] != decl:
                known["error"] = (
                    f"tensor {name!r} differs across workers: rank {known['rank']} declared "
                    f"{known['decl']['dtype']}{known['decl']['shape']}, rank {rank} declared "
                    f"{decl['dtype']}{decl['shape']}")
                return {"error": known["error"]}
            return known["result"]
        if self.num_servers == 0:
            return {"error": f"tensor {name!r}: there are no servers (DMLC_NUM_SERVER=0)"}
        key = self.next_key
        self.next_key += 1
        servers = []
        for i, nbytes in enumerate(decl["parts"]):
            alive = self._alive()
            if self.policy == "balanced":
                s = min(alive, key=lambda j: (self.load[j], j))
            else:
                s = alive[HASHES[self.policy](str(part_key(key, i))) % len(alive)]
            self.load[s] += nbytes
            servers.append(s)
        result = {"key": key, "servers": servers}
        writers = req.get("writers")  # the ranks that declare it (None: every worker; local reduce slices)
        self.tensors[name] = {"rank": rank, "decl": decl, "result": result, "ranks": {rank},
                              "since": time.monotonic(), "keeps_state": req.get("keeps_state") is True,
                              "writers": frozenset(int(r) for r in writers) if isinstance(writers, list) else None}
        return result

    def restore(self, reports: list[tuple[int, dict]], max_key: int, dead: set[int]) -> None:
        """A scheduler that took a running job over: the placements the workers hold (``reports``: (rank, tensor)
        with its declaration, key and servers), the highest tensor key any server holds, the servers lost.
        Later declarations of these tensors get the same answer; new ones get keys above every old one."""
        now = time.monotonic()
        self.dead = set(dead)
        for rank, t in reports:
            name = str(t["name"])
            known = self.tensors.get(name)
            if known is not None:
                known["ranks"].add(rank)
                continue
            decl = {"shape": list(t["shape"]), "dtype": str(t["dtype"]), "parts": [int(p) for p in t["parts"]]}
            result = {"key": int(t["key"]), "servers": [int(x) for x in t["servers"]]}
            writers = t.get("writers")
            self.tensors[name] = {"rank": rank, "decl": decl, "result": result, "ranks": {rank}, "since": now,
                                  "keeps_state": t.get("keeps_state") is True,
                                  "writers": frozenset(int(r) for r in writers) if isinstance(writers, list) else None}
            for nbytes, srv in zip(decl["parts"], result["servers"]):
                if 0 <= srv < self.num_servers:
                    self.load[srv] += nbytes
            max_key = max(max_key, result["key"])
        self.next_key = max_key + 1

    def misnamed(self, num_workers: int, after_s: float) -> list[tuple[str, set, str, set]]:
        """Pairs of tensors each declared by only some workers for ``after_s`` seconds, by disjoint sets of
        ranks: the signature of workers naming the same tensor differently (a slow worker declares nothing
        the others lack, so it never matches). A tensor declared only by some ranks by design (the local
        reduce's slices: ``writers``) waits only for those, and pairs only with one those ranks should have
        declared too."""
        now = time.monotonic()
        everyone = frozenset(range(num_workers))
        stuck = sorted((n, t["ranks"], t.get("writers") or everyone) for n, t in self.tensors.items()
                       if "error" not in t and not (t.get("writers") or everyone) <= t["ranks"]
                       and now - t["since"] > after_s and t["since"] >= self.fresh_since)
        return [(a, ra, b, rb) for i, (a, ra, wa) in enumerate(stuck) for b, rb, wb in stuck[i + 1:]
                if not ra & rb and rb <= wa and ra <= wb]

    def renumber(self, ranks: dict[int, int]) -> None:
        """Elastic training renumbered the workers: ranks not in ``ranks`` are gone."""
        for t in self.tensors.values():
            t["ranks"] = {ranks[r] for r in t["ranks"] if r in ranks}

    def fail(self, name: str, text: str) -> None:
        """Every later declaration of ``name`` gets ``text`` as its error."""
        self.tensors[name]["error"] = text

    def imbalance(self) -> float:
        """max load / mean load - 1 (0 = perfectly balanced)."""
        mean = sum(self.load) / max(1, len(self.load))
        return max(self.load) / mean - 1 if mean else 0.0
