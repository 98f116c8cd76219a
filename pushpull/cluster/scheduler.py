"""The scheduler process: rendezvous, address book, barriers, heartbeats,
tensor-to-server assignment and orderly shutdown.

It is the one place that sees every node, so it is also where mistakes that
would otherwise hang a job are turned into messages: a registration that never
completes names the missing ranks, a tensor declared with different shapes on
two workers is reported to every worker, a silent node is declared dead.
"""
from __future__ import annotations

import logging
import os
import socket
import secrets
import signal
import time
from dataclasses import dataclass, field

import zmq

from pushpull.cluster import nodes
from pushpull.cluster.address import bind_error, bind_host, scheduler_host
from pushpull.cluster.assign import Assigner
from pushpull.cluster.member import print_culprit
from pushpull.config import Config
from pushpull.transport.protocol import Header, Msg, MsgType, ProtocolError, decode_json, encode_json
from pushpull.transport.security import auth_for
from pushpull.transport.van import Van

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0
MISNAMED_AFTER_S = 5.0  # tensors declared by disjoint sets of workers this long are a naming mismatch  # how often registration says who it still waits for
SCHEDULER_MAX_MESSAGE = 4 << 20  # registrations, barriers, tensor declarations: JSON, small


@dataclass
class NodeInfo:
    identity: bytes
    role: str
    node_id: int
    info: dict
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False
    dead: bool = False  # a server lost in an elastic job (its partitions moved to the others)
    since_gen: int = 0  # the generation it came in with (a late worker: barriers begun before it don't wait for it)

    @property
    def who(self) -> str:
        return f"{nodes.describe(self.node_id)} (pid {self.info.get('pid')} on {self.info.get('hostname')})"


class Scheduler:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.van = Van("scheduler", batch_bytes=cfg.batch_bytes, auth=auth_for(cfg, "scheduler"))
        self.num_servers = cfg.num_server
        self.num_workers: int | None = None   # learnt from the first worker's declared size
        self.workers: dict[int, NodeInfo] = {}
        self.servers: list[NodeInfo] = []
        self.by_identity: dict[bytes, NodeInfo] = {}
        self.ready = False
        self.started = time.monotonic()
        # new for every run of the job (a secret may be reused across runs): workers name their shared-memory
        # segments with it, so a crashed run's leftovers are never mistaken for this run's
        self.job_id = secrets.token_hex(8)
        self.barriers: dict[tuple[str, int], set[bytes]] = {}
        self.barrier_gen: dict[tuple[str, int], int] = {}  # the generation each open barrier began in
        self.barrier_top = 0  # the highest barrier number a worker has reached (a late worker counts on from it)
        self.assigner: Assigner | None = None
        self.exit_code = 0
        listen = bind_host(cfg, scheduler_host(cfg))
        try:
            self.port = self.van.bind_router("nodes", listen, cfg.root_port, self._handle,
                                             advertised=scheduler_host(cfg), max_message_bytes=SCHEDULER_MAX_MESSAGE)
        except zmq.ZMQError as e:
            raise bind_error(listen, cfg.root_port, e) from None
        self.van.call_later(cfg.heartbeat_interval, self._check, every=cfg.heartbeat_interval)
        # a node that exits or is killed closes its connection at once; heartbeats stay for hung nodes
        self.van.monitor("nodes", zmq.EVENT_DISCONNECTED, self._on_disconnect)
        self.terminating = False  # every worker finished: nodes leaving now are not failures
        self.gen = 0  # membership generation: +1 each time an elastic job goes on without a worker
        self.refused: list[str] = []  # registrations refused (named in the registration timeout's error)
        self._next_progress = PROGRESS_EVERY_S
        self._reset_body: dict = {}
        self._reset_waiting: set[bytes] = set()  # servers that have not acknowledged the last RESET
        self.joined: set[int] = set()  # workers that called join() since the last generation
        self.max_workers: int | None = None  # elastic: the job's size at its start, the most a join refills
        self._joining: list[NodeInfo] = []  # workers admitted into the job by the generation now being applied
        self._join_queue: list[tuple[bytes, dict]] = []  # registrations that wait for a change to finish
        # PUSHPULL_SCHEDULER_RECOVER: this scheduler replaces a lost one; the job's nodes, which kept training,
        # register again and say where the job stands (docs/elastic.md, "A lost scheduler")
        self.recovering = bool(cfg.scheduler_recover)
        self._rejoined: dict[bytes, dict] = {}  # identity -> what the node said, until the membership is rebuilt

    def run(self) -> int:
        if self.recovering:
            log.warning("scheduler listening on %s:%d to take over a running job: waiting for its nodes to "
                        "register again", self.cfg.root_uri, self.port)
        log.info("scheduler listening on %s:%d, expecting %d server(s)", self.cfg.root_uri, self.port, self.num_servers)
        self.van.run_forever()
        return self.exit_code

    # ------------------------------------------------------------ helpers --
    def _send(self, node: NodeInfo | bytes, header: Header, frames: list = ()) -> None:
        identity = node.identity if isinstance(node, NodeInfo) else node
        header.sender = nodes.SCHEDULER
        self.van.send("nodes", header, list(frames), identity=identity)

    def _all(self) -> list[NodeInfo]:
        return list(self.workers.values()) + self._live_servers()

    def _refuse(self, identity: bytes, text: str) -> None:
        """Refuse a registration, and remember it: the ones that did register learn of it at the timeout."""
        self.refused.append(text)
        log.error("refused a registration: %s", text)
        self._error(identity, text)

    def _error(self, identity: bytes, text: str, key: int = 0, recover: bool = False) -> None:
        body = {"error": text, **({"recover": True} if recover else {})}
        self._send(identity, Header(MsgType.ERROR, key=key), [encode_json(body)])

    def _stop(self, code: int) -> None:
        self.exit_code = code
        # give the I/O thread a moment to flush the last messages
        self.van.call_later(0.3, lambda: self.van.stop(join=False))

    # ------------------------------------------------------------ dispatch --
    def _handle(self, identity: bytes, msg: Msg) -> None:
        t = msg.header.type
        node = self.by_identity.get(identity)
        if node is not None:
            node.last_seen = time.monotonic()
        try:
            if t == MsgType.REGISTER:
                self._register(identity, decode_json(msg.body()))
            elif node is None and self.recovering:
                pass  # queued while the old scheduler was gone, before this node registered again: it sends it again
            elif node is None:
                self._error(identity, f"{t.name} from an unregistered node")
            elif t == MsgType.HEARTBEAT:
                self._send(node, Header(MsgType.HEARTBEAT_ACK))
            elif t == MsgType.BARRIER:
                self._barrier(node, msg.header.key, decode_json(msg.body()).get("group", "worker"))
            elif t == MsgType.ASSIGN:
                self._assign(node, msg)
            elif t == MsgType.FINISH:
                self._finish(node)
            elif t == MsgType.RESET_ACK:
                self._reset_ack(node, msg.header.gen)
            elif t == MsgType.JOIN:
                self._join(node)
            else:
                self._error(identity, f"the scheduler does not handle {t.name}")
        except ProtocolError as e:
            log.warning("bad %s from %r: %s", t.name, identity, e)
            self._error(identity, f"bad {t.name}: {e}")

    # ------------------------------------------------------------ registration --
    def _register(self, identity: bytes, info: dict) -> None:
        if info.get("recover"):
            self._rejoin(identity, info)
            return
        if self.recovering:
            self._join_queue.append((identity, info))  # a late worker: once the membership is rebuilt
            return
        role = info.get("role")
        if identity in self.by_identity:
            self._refuse(identity, f"{self.by_identity[identity].who} is registered already")
            return
        if self.ready:
            if role == "worker" and self.cfg.min_workers and not self.terminating:
                self._late_worker(identity, info)
            elif role == "server" and self.cfg.min_workers and not self.terminating:
                self._late_server(identity, info)
            else:
                self._refuse(identity, "the job is already running; a late node cannot join" + (
                    "" if role != "worker" else " (a worker can, in an elastic job: PUSHPULL_MIN_WORKERS / "
                                                "pushpull launch --min-workers)"))
            return
        if role == "server":
            if len(self.servers) >= self.num_servers:
                self._refuse(identity, f"DMLC_NUM_SERVER={self.num_servers} servers have registered already")
                return
            node = NodeInfo(identity, role, nodes.server_node(len(self.servers)), info)
            self.servers.append(node)
        elif role == "worker":
            rank, size = int(info.get("rank", -1)), int(info.get("size", 0))
            if self.num_workers is None:
                self.num_workers = size
            if size != self.num_workers:
                self._refuse(identity, f"worker rank {rank} says the job has {size} workers, but earlier "
                                      f"workers said {self.num_workers}: check DMLC_NUM_WORKER / "
                                      f"BYTEPS_LOCAL_SIZE on every machine")
                return
            if not 0 <= rank < size:
                self._refuse(identity, f"worker rank {rank} is outside 0..{size - 1}")
                return
            if rank in self.workers:
                self._refuse(identity, f"two workers claim rank {rank} ({self.workers[rank].info.get('hostname')} "
                                      f"and {info.get('hostname')}): check DMLC_WORKER_ID / BYTEPS_LOCAL_RANK")
                return
            node = NodeInfo(identity, role, rank, info)
            self.workers[rank] = node
        else:
            self._refuse(identity, f"unknown role {role!r}")
            return
        self.by_identity[identity] = node
        log.info("registered %s", node.who)
        if self.num_workers is not None and len(self.workers) == self.num_workers \
                and len(self.servers) == self.num_servers:
            self._start_job()

    def _late_worker(self, identity: bytes, info: dict) -> None:
        """Elastic training: a worker that registers after the start (a replacement the launcher started, or
        one started by hand) joins the running job as its last rank, up to the job's size at its start. Its
        connections' identity is the rank it claims (unique among the live workers); servers learn it with
        the new generation, and the worker gets its address book only once every server has applied it."""
        if self._reset_waiting or self._joining:  # a change is being applied: this one follows it
            self._join_queue.append((identity, info))
            return
        first = int(info.get("rank", -1))
        taken = {int(w.info.get("rank", -1)) for w in self.workers.values()}
        if first < 0 or first in taken:
            self._refuse(identity, f"a late worker claims rank {first}, which a live worker registered with; "
                                   f"start it with the rank of the worker it replaces (DMLC_WORKER_ID / "
                                   f"BYTEPS_LOCAL_RANK), or any rank no live worker holds")
            return
        if len(self.workers) >= (self.max_workers or 0):
            self._refuse(identity, f"the job has its {len(self.workers)} workers (its size at the start); a late "
                                   f"worker only replaces a lost one")
            return
        node = NodeInfo(identity, "worker", len(self.workers), info, since_gen=self.gen + 1)
        self.workers[node.node_id] = node
        self.by_identity[identity] = node
        self.num_workers = len(self.workers)
        self._joining.append(node)
        if self.assigner is not None:
            self.assigner.fresh_since = time.monotonic()
        log.warning("a late worker (pid %s on %s, registered as rank %d) comes into the running job as rank %d "
                    "of %d", info.get("pid"), info.get("hostname"), first, node.node_id, self.num_workers)
        # "came_in": the workers tell a change that brought someone in from one that only lost someone (DiLoCo
        # hands the newcomer its schedule then)
        self._new_generation(f"a late worker came in as rank {node.node_id}", {}, {"came_in": [node.node_id]})

    def _late_server(self, identity: bytes, info: dict) -> None:
        """Elastic training: a server that registers after the start (a replacement the launcher started under
        --restart-servers, or one started by hand) takes a lost server's place: its index, and a fair share of
        the partitions, which move to it in a new generation (the workers declare them there; an outer or a
        store key starts from the workers' seeds). Without a lost server to replace it is refused."""
        if self._reset_waiting or self._joining:  # a change is being applied: this one follows it
            self._join_queue.append((identity, info))
            return
        dead = [i for i, s in enumerate(self.servers) if s.dead]
        if not dead:
            self._refuse(identity, f"the job has its {self.num_servers} servers; a late server only replaces a "
                                   f"lost one")
            return
        if not isinstance(info.get("host"), str) or not isinstance(info.get("port"), int):
            self._refuse(identity, f"a late server gave no address (host {info.get('host')!r}, port "
                                   f"{info.get('port')!r})")
            return
        index = dead[0]
        node = NodeInfo(identity, "server", nodes.server_node(index), info)
        node.last_seen = time.monotonic()
        self.servers[index] = node
        self.by_identity[identity] = node
        self._send(node, Header(MsgType.REGISTER_ACK), [encode_json(self._book(node))])
        moved = self.assigner.add_server(index) if self.assigner is not None else {}
        log.warning("a replacement server (pid %s on %s) takes server %d's place; %d partition(s) move to it",
                    info.get("pid"), info.get("hostname"), index, len(moved))
        self._new_generation(f"a replacement server came in as server {index}", moved,
                             {"servers_added": [self._server_entry(index, node)]})

    @staticmethod
    def _server_entry(index: int, s: NodeInfo) -> dict:
        """Where the workers reach server ``index`` (its entry in the address book)."""
        return {"rank": index, "host": s.info["host"], "port": s.info["port"], "lane": s.info.get("lane"),
                "ipc": s.info.get("ipc")}

    def _book(self, node: NodeInfo) -> dict:
        # a server lost in an elastic job is left out (its partitions moved); the others keep their index
        servers = [self._server_entry(i, s) for i, s in enumerate(self.servers) if not s.dead]
        workers = [{"rank": r, "hostname": w.info.get("hostname"), "local_rank": w.info.get("local_rank"),
                    "pid": w.info.get("pid"), "local_reduce": w.info.get("local_reduce")}
                   for r, w in sorted(self.workers.items())]
        return {"node_id": node.node_id, "num_workers": self.num_workers, "num_servers": self.num_servers,
                "job_id": self.job_id, "gen": self.gen, "servers": servers, "workers": workers,
                "barrier_seq": self.barrier_top, "scheduler_pid": os.getpid()}

    def _start_job(self) -> None:
        self.ready = True
        self.max_workers = self.num_workers
        self.assigner = Assigner(self.num_servers, self.cfg.key_hash_fn)
        now = time.monotonic()
        for node in self._all():
            # a node sends heartbeats once it has its book: the wait for the last registration is not silence
            node.last_seen = now
            self._send(node, Header(MsgType.REGISTER_ACK), [encode_json(self._book(node))])
        log.info("job started: %d workers, %d servers", self.num_workers, self.num_servers)

    # ------------------------------------------------------------ barrier --
    def _barrier_members(self, group: str, seq: int) -> list[NodeInfo]:
        """Who barrier ``seq`` of ``group`` waits for: the group's live nodes that were in the job when it
        began (a worker that came in later counts its barriers from the next one: its book says where)."""
        began = self.barrier_gen.get((group, seq), self.gen)
        members = self.workers.values() if group == "worker" else self._all()
        return [m for m in members if m.since_gen <= began]

    def _barrier(self, node: NodeInfo, seq: int, group: str) -> None:
        if node.role == "worker":
            self.barrier_top = max(self.barrier_top, seq)
        self.barrier_gen.setdefault((group, seq), self.gen)
        self.barriers.setdefault((group, seq), set()).add(node.identity)
        self._release_if_complete(group, seq)

    def _release_if_complete(self, group: str, seq: int) -> None:
        """Release barrier ``seq`` of ``group`` once every node it waits for has arrived (a lost worker's
        arrival may linger in the set)."""
        members = self._barrier_members(group, seq)
        if {m.identity for m in members} <= self.barriers[(group, seq)]:
            for m in members:
                self._send(m, Header(MsgType.BARRIER_RELEASE, key=seq))
            del self.barriers[(group, seq)]
            self.barrier_gen.pop((group, seq), None)

    # ------------------------------------------------------------ assignment --
    def _assign(self, node: NodeInfo, msg: Msg) -> None:
        assert self.assigner is not None
        req = decode_json(msg.body())
        result = self.assigner.assign(node.node_id, req)
        if "error" in result:
            # every worker must learn of it, not only the one that asked; one that had not declared
            # the tensor yet drops this and gets the error again when it does ("repeat")
            text = result["error"]
            for w in ([node] if result.get("repeat") else
                      [w for w in self.workers.values() if w not in self._joining]):
                self._send(w, Header(MsgType.ERROR, req_id=msg.header.req_id, extra=1),
                           [encode_json({"error": text, "tensor": req.get("name")})])
            return
        self._send(node, Header(MsgType.ASSIGN_ACK, req_id=msg.header.req_id), [encode_json(result)])

    # ------------------------------------------------------------ liveness --
    def _waiting_for(self) -> str:
        """Who registration still waits for, and which attempts were refused."""
        if self.num_workers is None:
            workers = "no worker registered yet"
        else:
            missing = sorted(set(range(self.num_workers)) - set(self.workers))
            workers = f"{len(self.workers)} of {self.num_workers} workers registered (missing rank(s) {missing})"
        text = f"{workers}, {len(self.servers)} of {self.num_servers} server(s)"
        if self.refused:
            text += "; refused: " + "; ".join(self.refused[-3:])
        return text

    def _check(self) -> None:
        now = time.monotonic()
        if self.recovering:
            # the nodes wait PUSHPULL_SCHEDULER_RECOVERY from the loss: decide before they give up
            limit = self.cfg.register_timeout
            if self.cfg.scheduler_recovery:
                limit = min(limit, max(1.0, self.cfg.scheduler_recovery - 5.0))
            if now - self.started > limit:
                self._recovered(force=True)
            return
        if not self.ready:
            waited = now - self.started
            if waited > self.cfg.register_timeout:
                text = (f"registration timed out after {self.cfg.register_timeout:g}s (PUSHPULL_REGISTER_TIMEOUT): "
                        f"{self._waiting_for()}")
                log.error(text)
                for n in self._all():
                    self._error(n.identity, text)
                self._stop(1)
            elif waited >= self._next_progress:
                self._next_progress += PROGRESS_EVERY_S
                text = f"waiting for the job to start ({waited:.0f}s): {self._waiting_for()}"
                log.warning(text)
                for n in self._all():
                    self._send(n, Header(MsgType.PROGRESS), [encode_json({"text": text})])
            return
        self._check_names()
        for n in self._all():
            if n.finished:
                continue
            silent = now - n.last_seen
            if silent > self.cfg.heartbeat_timeout:
                self._declare_dead(n, f"no heartbeat for {silent:.0f}s (PUSHPULL_HEARTBEAT_TIMEOUT="
                                      f"{self.cfg.heartbeat_timeout:g}): hung or unreachable")
                return

    def _check_names(self) -> None:
        """Workers that name a tensor differently each wait for the others on a key nobody else declares;
        tell all of them within seconds, naming who declared what, instead of at their timeout."""
        if self.assigner is None or self.num_workers is None:
            return
        for a, ranks_a, b, ranks_b in self.assigner.misnamed(self.num_workers, MISNAMED_AFTER_S):
            text = (f"tensor names differ across workers: rank(s) {sorted(ranks_a)} declared {a!r} and rank(s) "
                    f"{sorted(ranks_b)} declared {b!r}, and for {MISNAMED_AFTER_S:g}s neither has been declared by "
                    f"the others: do all workers give their tensors the same names, in every step?")
            log.error(text)
            for name in (a, b):
                self.assigner.fail(name, text)
                for w in self.workers.values():
                    self._send(w, Header(MsgType.ERROR, extra=1), [encode_json({"error": text, "tensor": name})])

    def _on_disconnect(self, event: int, endpoint: str) -> None:
        """Some node's connection closed: find which by sending each a no-op (a ROUTER knows at once that
        an identity has no connection any more), shortly after, so a reconnecting peer is not taken for dead."""
        if not self.terminating and self.exit_code == 0:
            self.van.call_later(0.05, self._probe)

    def _probe(self) -> None:
        if self.terminating:
            return
        for n in self._all():
            if not n.finished and not self.van.reachable("nodes", n.identity,
                                                         Header(MsgType.HEARTBEAT_ACK, sender=nodes.SCHEDULER)):
                self._declare_dead(n, "its connection closed (the process exited or was killed)")
                return

    def _declare_dead(self, n: NodeInfo, reason: str) -> None:
        """Tell every other node who failed and why, then end the job (or, for a worker of an elastic job
        with enough left, go on without it)."""
        if self.exit_code:
            return
        elastic = self.ready and not self.terminating and self.cfg.min_workers
        if elastic and reason.startswith("no heartbeat") and n.info.get("pid") \
                and n.info.get("hostname") == socket.gethostname():
            # a hung node (stopped) the job goes on without still holds its process: name it, so that the
            # launcher ends it rather than wait for it at the end
            print_culprit(int(n.info["pid"]), f"{n.who} was dropped from the job: {reason}")
        if elastic and n.role == "worker" and len(self.workers) - 1 >= self.cfg.min_workers:
            self._shrink(n, reason)
            return
        if elastic and n.role == "server" and len(self._live_servers()) > 1:
            self._lose_server(n, reason)
            return
        log.error("%s failed: %s", n.who, reason)
        if n.info.get("pid") and n.info.get("hostname") == socket.gethostname():
            print_culprit(int(n.info["pid"]), f"{n.who} failed: {reason}")
        for m in self._all():
            if m is not n:
                self._send(m, Header(MsgType.NODE_FAILED),
                           [encode_json({"who": n.who, "node": n.node_id, "pid": n.info.get("pid"),
                                         "hostname": n.info.get("hostname"), "reason": reason})])
        self._stop(1)

    # ------------------------------------------------------------ a lost scheduler --
    def _rejoin(self, identity: bytes, info: dict) -> None:
        """A node that lost its scheduler registers again, saying where the job stands for it. A recovering
        scheduler collects them until every worker and server is back; one that never went away (the
        connection only dropped) takes a node it knows back at once."""
        known = self.by_identity.get(identity)
        if not self.recovering:
            if known is None:
                self._error(identity, "this scheduler does not know this node (it started its own job, or took "
                                      "the job over without it)", recover=True)
                return
            known.last_seen = time.monotonic()
            self._send(known, Header(MsgType.REGISTER_ACK), [encode_json(dict(self._book(known), recovered=True))])
            return
        jobs = {str(i.get("job_id")) for i in self._rejoined.values()}
        if jobs and str(info.get("job_id")) not in jobs:
            self._error(identity, f"this node belongs to job {info.get('job_id')}, the others that registered again "
                                  f"to {sorted(jobs)}", recover=True)
            return
        self._rejoined[identity] = info
        self._recovered(force=False)

    def _recovered(self, force: bool) -> None:
        """Rebuild the membership from the nodes that registered again, once every worker (as many as they say
        the job has) and every live server is back, or at the deadline (``force``) with those that are: in an
        elastic job the missing ones are lost as any node is (a new generation); otherwise the job ends, naming
        them. A change the servers applied and some workers had not heard of (the old scheduler was lost while it
        applied it) is made again (:meth:`_reported_change`): the workers are counted as it numbered them, the
        servers it lost as lost, the replacement it took in is waited for."""
        infos = list(self._rejoined.items())
        workers = [(ident, i) for ident, i in infos if i.get("role") == "worker"]
        servers = {int(i["node_id"]) - nodes.SERVER_BASE: (ident, i) for ident, i in infos if i.get("role") == "server"}
        top = max([int(i.get("gen", 0)) for _, i in servers.values()], default=0)
        change = self._reported_change(servers, top) if any(int(i.get("gen", 0)) < top for _, i in workers) else {}
        numbered = change.get("ranks")  # first rank -> rank, as the change numbered the workers
        rank_of = {ident: (numbered.get(int(i.get("rank", -1)), -1) if numbered is not None and
                           int(i.get("gen", 0)) < top else int(i["node_id"])) for ident, i in workers}
        size = change["num_workers"] if "num_workers" in change else \
            max((int(i.get("size_now", 0)) for _, i in workers), default=0)
        added = {int(a["rank"]) for a in change.get("servers_added", ())}
        lost_servers = {int(x) for _, i in workers for x in i.get("servers_lost", ())} | \
            (set(change.get("lost_servers", ())) - added)
        want_servers = set(range(self.num_servers)) - lost_servers | added
        ranks = {r for r in rank_of.values() if r >= 0}
        complete = workers and len(ranks) >= size and want_servers <= set(servers)
        if not complete and not force:
            return
        # nodes this job no longer has: a worker the change dropped, a server lost (or one whose admission never
        # reached the workers): told so, they end (the launcher starts a lost server again, as a replacement)
        strays = [ident for ident, r in rank_of.items() if r < 0] + \
            [servers.pop(index)[0] for index in sorted(set(servers) - want_servers)]
        for ident in strays:
            self._error(ident, "the job went on without this node while its scheduler was lost", recover=True)
        workers = [(ident, i) for ident, i in workers if rank_of[ident] >= 0]
        missing_w = sorted(set(range(size)) - ranks)
        missing_s = sorted(want_servers - set(servers))
        waited = time.monotonic() - self.started
        elastic = self.cfg.min_workers
        if not workers or (missing_w and not (elastic and len(workers) >= self.cfg.min_workers)) or \
                (missing_s and not (elastic and servers)):
            text = (f"the new scheduler could not take the job over within {waited:.0f}s (PUSHPULL_REGISTER_TIMEOUT="
                    f"{self.cfg.register_timeout:g}): worker rank(s) {missing_w} and server(s) {missing_s} did not "
                    f"register again" + ("" if workers else " (no worker did)"))
            log.error(text)
            for ident, _ in infos:
                self._error(ident, text, recover=True)
            self.recovering = False
            self._stop(1)
            return
        self.recovering = False
        self.job_id = str(workers[0][1].get("job_id") or self.job_id)
        self.gen = max(int(i.get("gen", 0)) for _, i in infos)
        gens = {int(i.get("gen", 0)) for _, i in infos}
        self.barrier_top = max(int(i.get("barrier_seq", 0)) for _, i in workers)
        self.servers = []
        for index in range(self.num_servers):
            ident, i = servers.get(index, (b"", {"host": "", "port": 0}))
            node = NodeInfo(ident, "server", nodes.server_node(index), i, dead=index not in servers)
            self.servers.append(node)
            if ident:
                self.by_identity[ident] = node
        for ident, i in sorted(workers, key=lambda w: rank_of[w[0]]):
            node = NodeInfo(ident, "worker", rank_of[ident], i, finished=bool(i.get("finished")))
            self.workers[node.node_id] = node
            self.by_identity[ident] = node
        self.num_workers = size
        self.max_workers = max(int(i.get("size", size)) for _, i in workers)  # the size it registered with first
        self.assigner = Assigner(self.num_servers, self.cfg.key_hash_fn)
        self.assigner.restore([(rank_of[ident], t) for ident, i in workers for t in i.get("tensors", ())],
                              max(int(i.get("max_key", 0)) for _, i in infos),
                              {index for index in range(self.num_servers) if index not in servers})
        moved = change.get("moved", {})
        self.assigner.apply_moves(moved)
        self.ready = True
        for node in self._all():
            self._send(node, Header(MsgType.REGISTER_ACK), [encode_json(dict(self._book(node), recovered=True))])
        log.warning("took the running job over %.1fs after starting: %d worker(s), %d server(s), generation %d",
                    waited, len(workers), len(servers), self.gen)
        extra = {k: v for k, v in (("lost_servers", sorted(set(change.get("lost_servers", ())) - added)),
                                   ("servers_added", [a for a in change.get("servers_added", ())
                                                      if int(a["rank"]) in servers])) if v}
        if missing_w or missing_s:  # elastic: lost as any node is, in one change (one generation for all)
            self._lose_missing(missing_w, missing_s, moved, extra)
        elif len(gens) > 1:  # the nodes in different generations: one every node applies from the start
            self._new_generation("the scheduler was replaced while a change of the job was applied", moved, extra)
        queued, self._join_queue = self._join_queue, []
        for identity, info in queued:  # late workers that came while the job was being taken over
            self._register(identity, info)

    def _reported_change(self, servers: dict, top: int) -> dict:
        """The change the newest generation's servers applied (each reports the last one it applied when it
        registers again), parsed: its moves, servers added and lost, and the workers' numbering; {} where none is
        readable (then it is made again without them, and its moved tensors fail, naming themselves)."""
        for _, info in servers.values():
            change = info.get("change")
            if int(info.get("gen", 0)) != top or not isinstance(change, dict) or not change:
                continue
            try:
                out = {"moved": {int(k): int(v) for k, v in dict(change.get("moved") or {}).items()},
                       "lost_servers": [int(x) for x in change.get("lost_servers") or ()],
                       "servers_added": [dict(a, rank=int(a["rank"])) for a in change.get("servers_added") or ()]}
                if isinstance(change.get("ranks"), dict):
                    # a worker the change took in never had its address book: it registers again as a late one
                    came_in = {int(r) for r in change.get("came_in") or ()}
                    out["ranks"] = {int(k): int(v) for k, v in change["ranks"].items() if int(v) not in came_in}
                    out["num_workers"] = int(change["num_workers"]) - len(came_in)
            except (TypeError, ValueError, KeyError) as e:
                log.error("a server reported the change in flight unreadably (%r); it is made again without it", e)
                return {}
            out["servers_added"] = [a for a in out["servers_added"] if 0 <= a["rank"] < self.num_servers]
            return out
        return {}

    def _lose_missing(self, ranks: list[int], servers: list[int], moved: dict[int, int] | None = None,
                      extra: dict | None = None) -> None:
        """The nodes that did not register again with a new scheduler: the job goes on without all of them in
        one generation (workers renumbered, the servers' partitions moved), which also carries the change in
        flight (``moved``, ``extra``: :meth:`_reported_change`)."""
        survivors = [w for r, w in sorted(self.workers.items()) if r not in ranks]
        self._renumber(survivors)
        moved = dict(moved or {})
        extra = dict(extra or {})
        for index in servers:
            moved.update(self.assigner.remove_server(index))
        what = ", ".join([f"worker rank(s) {ranks}"] * bool(ranks) + [f"server(s) {servers}"] * bool(servers))
        log.warning("%s did not register again with the new scheduler; going on with %d workers and %d server(s)",
                    what, len(survivors), len(self._live_servers()))
        if servers:
            extra["lost_servers"] = sorted(set(extra.get("lost_servers", [])) | set(servers))
        self._new_generation(f"{what} did not register again with the new scheduler", moved, extra)

    # ------------------------------------------------------------ elastic --
    def _shrink(self, lost: NodeInfo, reason: str) -> None:
        """Go on without worker ``lost``: a new generation, the survivors renumbered 0..n'-1 in their old
        order. Servers apply it first (they drop every round in flight and expect n' pushes), and only once
        all have acknowledged are the workers told, so no worker pushes to a server of the old generation."""
        log.warning("%s failed: %s; going on with %d workers (PUSHPULL_MIN_WORKERS=%d)", lost.who, reason,
                    len(self.workers) - 1, self.cfg.min_workers)
        del self.workers[lost.node_id]
        self.by_identity.pop(lost.identity, None)
        self._renumber([w for _, w in sorted(self.workers.items())])
        self._new_generation(f"{lost.who} failed: {reason}", {})

    def _renumber(self, survivors: list[NodeInfo]) -> None:
        """The workers left are ranks 0..n'-1 in their old order (the assigner learns who declared what)."""
        renumber = {w.node_id: new for new, w in enumerate(survivors)}
        if self.assigner is not None:
            self.assigner.renumber(renumber)
        self.workers = {}
        for new, w in enumerate(survivors):
            w.node_id = new
            self.workers[new] = w
        self.num_workers = len(survivors)

    def _lose_server(self, lost: NodeInfo, reason: str) -> None:
        """Go on without server ``lost``: its partitions move to the least loaded live servers (every worker
        declares them there again, and the rounds in flight are dropped and pushed again)."""
        index = lost.node_id - nodes.SERVER_BASE
        lost.dead = True
        self.by_identity.pop(lost.identity, None)
        moved = self.assigner.remove_server(index) if self.assigner is not None else {}
        log.warning("%s failed: %s; its %d partition(s) move to the other %d server(s)", lost.who, reason,
                    len(moved), len(self._live_servers()))
        self._new_generation(f"{lost.who} failed: {reason}", moved, {"lost_servers": [index]})

    def _live_servers(self) -> list[NodeInfo]:
        return [s for s in self.servers if not s.dead]

    def _join(self, node: NodeInfo) -> None:
        """join(): the worker ran out of data. The servers complete rounds without it from now on; when every
        worker has joined, a new generation starts (every key's rounds from 1, as the joined ranks skipped
        some) and releases them all with the rank that joined last (Horovod's join)."""
        if node.role != "worker" or node.node_id in self.joined:
            return
        self.joined.add(node.node_id)
        for w in self.workers.values():
            if w.finished and w.node_id not in self.joined:
                self._left_without_join(w, node)
        for s in self._live_servers():
            self._send(s, Header(MsgType.JOINED, key=node.node_id))
        for w in self.workers.values():  # so that a worker's join() can say who it still waits for
            self._send(w, Header(MsgType.JOINED, key=node.node_id))
        if len(self.joined) == len(self.workers):
            last, self.joined = node.node_id, set()
            self._new_generation("every worker joined", {}, {"joined_last": last})

    def _left_without_join(self, gone: NodeInfo, waiting: NodeInfo) -> None:
        """``gone`` finished without join() while ``waiting`` is in it: join() returns only once every rank
        has joined, so ``waiting`` would wait for it until its deadline; tell it now, naming the rank."""
        rank = next((r for r, w in self.workers.items() if w is gone), "?")
        self._send(waiting, Header(MsgType.NODE_FAILED),
                   [encode_json({"who": gone.who, "node": gone.node_id,
                                 "reason": f"worker rank {rank} finished without calling join(), which every rank "
                                           f"must call once it runs out of data (Horovod's join)"})])

    def _new_generation(self, lost: str, moved: dict[int, int], extra: dict | None = None) -> None:
        """Tell the live servers first and the workers once all servers have acknowledged, so that no
        worker pushes in the new generation to a server still in the old one."""
        self.gen += 1
        body = {"gen": self.gen, "num_workers": self.num_workers,
                "ranks": {str(w.info["rank"]): w.node_id for w in self.workers.values()},  # first -> now
                "moved": {str(k): v for k, v in moved.items()}, "lost": lost, **(extra or {})}
        if self._reset_waiting:  # the last change has not reached the workers yet: they get both in this one
            prev = self._reset_body
            body["moved"] = {**prev["moved"], **body["moved"]}
            body["lost"] = f"{prev['lost']}; {lost}"
            for k in ("lost_servers", "servers_added", "came_in"):
                if prev.get(k) or body.get(k):
                    body[k] = list(prev.get(k, [])) + list(body.get(k, []))
        self._reset_body = body
        self._reset_waiting = {s.identity for s in self._live_servers()}
        for s in self._live_servers():
            self._send(s, Header(MsgType.RESET, gen=self.gen), [encode_json(self._reset_body)])
        if not self._reset_waiting:
            self._reset_workers()

    def _reset_ack(self, node: NodeInfo, gen: int) -> None:
        if gen != self.gen or node.identity not in self._reset_waiting:
            return
        self._reset_waiting.discard(node.identity)
        if not self._reset_waiting:
            self._reset_workers()

    def _reset_workers(self) -> None:
        if (os.environ.get("PUSHPULL_FAILPOINT") == "scheduler-dies-before-workers-hear-of-a-replacement"
                and self._reset_body.get("servers_added") and not self.cfg.scheduler_recover):
            # a test's fault injection: lost at the worst moment for a replacement server (docs/elastic.md)
            log.warning("PUSHPULL_FAILPOINT: the scheduler dies after the servers applied a replacement server's "
                        "change, before the workers hear of it")
            os.kill(os.getpid(), signal.SIGKILL)
        joining, self._joining = self._joining, []
        for w in self.workers.values():
            if w in joining:  # its address book, now that every server maps its connections
                self._send(w, Header(MsgType.REGISTER_ACK), [encode_json(self._book(w))])
            else:
                self._send(w, Header(MsgType.RESET, gen=self.gen), [encode_json(self._reset_body)])
        for group, seq in list(self.barriers):  # barriers the lost worker had not reached may now be complete
            self._release_if_complete(group, seq)
        queued, self._join_queue = self._join_queue, []
        for identity, info in queued:  # late workers that registered while this change was applied
            if self.terminating or self.exit_code:
                self._refuse(identity, f"the job is ending; a late {info.get('role', 'node')} cannot join it")
            elif identity not in self.by_identity:
                (self._late_server if info.get("role") == "server" else self._late_worker)(identity, info)

    def _finish(self, node: NodeInfo) -> None:
        node.finished = True
        if node.role == "worker" and node.node_id not in self.joined:
            for w in self.workers.values():
                if w.node_id in self.joined:
                    self._left_without_join(node, w)
        if all(w.finished for w in self.workers.values()):
            self.terminating = True
            queued, self._join_queue = self._join_queue, []
            for identity, info in queued:
                self._refuse(identity, f"the job is ending; a late {info.get('role', 'node')} cannot join it")
            log.info("all workers finished; terminating")
            for n in self._all():
                self._send(n, Header(MsgType.TERMINATE))
            self._stop(0)


def run_scheduler(cfg: Config) -> int:
    return Scheduler(cfg).run()
