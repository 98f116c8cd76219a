"""Who a server's workers are: ps-lite's Postoffice, for a server.

The job's registration and failure watch (:class:`pushpull.cluster.member.Member`), the number of workers and
the membership generation, the ranks that called join(), and which rank each connection is. The serving
(:mod:`pushpull.server.server`) asks this for the sender of every request and tells it of each RESET.
"""
from __future__ import annotations

from typing import Callable

from pushpull.cluster import nodes
from pushpull.cluster.member import Member
from pushpull.config import Config
from pushpull.transport.protocol import Header, Msg, MsgType
from pushpull.transport.van import Van

RANK_CACHE = 4096  # connection identities whose rank is remembered (the cache starts over beyond)


class Members:
    """The server's view of the job's workers. It exists so that membership has one owner: the one check that a
    request comes from the rank it names (its connection's), the one place a RESET renumbers the ranks and
    moves the generation on, and the messages held until the address book says how many workers there are,
    rather than these being spread through the push/pull code."""

    def __init__(self, van: Van, cfg: Config, info: dict, on_registered: Callable[[], None],
                 on_message: Callable[[Msg], None]):
        """``on_registered()`` runs on the I/O thread once the address book is in (number and node id set)."""
        self.cluster = Member(van, cfg, info, on_registered=self._registered, on_message=on_message)
        self._on_registered = on_registered
        self.gen = 0  # membership generation (elastic): messages of an older one are stale and dropped
        self.last_change: dict = {}  # the moves and servers of the last RESET applied (reset())
        self.joined: set[int] = set()  # ranks that called join() (shared with every KeyState)
        self.rank_now: dict[int, int] | None = None  # a connection's first rank -> its rank now (after a RESET)
        self.num_workers = 0
        self.node_id = -1
        self._early: list[tuple[bytes, Msg]] = []  # worker messages that beat our address book
        self._identity_rank: dict[bytes, int | None] = {}  # nodes.rank_of_identity's answers (a regex each)

    def register(self) -> None:
        """Join the job (raises ClusterError if it cannot)."""
        self.cluster.register()

    def wait(self) -> int:
        """Until the job ends (0) or this server's cluster fails (1)."""
        while not self.cluster.terminated.wait(0.2):
            if self.cluster.failure:
                return 1
        return 0

    def _registered(self, book: dict) -> None:
        """Runs on the I/O thread: a worker's INIT can arrive as soon as the workers have
        the book, and must never be counted against an unknown number of workers."""
        self.num_workers = int(book["num_workers"])
        self.node_id = int(book["node_id"])
        self._on_registered()

    def hold(self, identity: bytes, msg: Msg) -> bool:
        """Keep a message that came before the address book (True), for :meth:`take_early` to give back."""
        if self.num_workers != 0:
            return False
        self._early.append((identity, msg))
        return True

    def take_early(self) -> list[tuple[bytes, Msg]]:
        early, self._early = self._early, []
        return early

    def refusal(self, identity: bytes, h: Header) -> str | None:
        """Why a worker's request is refused (None: its connection is the rank it names). The rank is the
        connection's (a ROUTER admits one live connection per identity), not what a header says: a member
        cannot push or pull as another rank."""
        rank = self._identity_rank.get(identity, -1)
        if rank == -1:
            if len(self._identity_rank) >= RANK_CACHE:
                self._identity_rank.clear()
            rank = self._identity_rank[identity] = nodes.rank_of_identity(identity)
        if self.rank_now is not None and rank is not None:
            rank = self.rank_now.get(rank)  # None: a lost worker's connection
        if rank is None or rank != h.sender or not 0 <= rank < self.num_workers:
            return (f"{h.type.name} from the connection of {'rank ' + str(rank) if rank is not None else 'no worker'} "
                    f"claims to be rank {h.sender}; refused")
        return None

    def reset(self, d: dict) -> bool:
        """A RESET's new membership (its JSON body ``d``): generation, number of workers, each connection's rank
        now; nobody has joined. Says whether every rank stays where it was (the end of a join())."""
        self.joined.clear()
        self.gen = int(d["gen"])
        rank_now = {int(first): int(now) for first, now in d["ranks"].items()}
        same = ("joined_last" in d and int(d["num_workers"]) == self.num_workers
                and all(now == (self.rank_now or {}).get(first, first) for first, now in rank_now.items()))
        self.num_workers = int(d["num_workers"])
        self.rank_now = rank_now
        # where partitions went in it: a scheduler that takes the job over before every worker heard of this change
        # makes it again (Scheduler._change_in_flight)
        self.last_change = {k: d[k] for k in ("moved", "servers_added", "lost_servers", "ranks", "num_workers",
                                              "came_in") if d.get(k)}
        return same

    def ack_reset(self) -> None:
        self.cluster.send(Header(MsgType.RESET_ACK, gen=self.gen))
