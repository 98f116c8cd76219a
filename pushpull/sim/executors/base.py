"""What a strategy is: a function from the stream of ready gradients to
communication tasks, plus the queue discipline the tasks are admitted under.

Backward compute is never gated by communication, so the ready times of an
iteration's gradients are known when the backward starts; a strategy can
therefore be a pure function of that stream, which keeps each one small and
testable on its own. The event simulation (:mod:`pushpull.sim.events`) owns
time, the network and admission.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pushpull.profiles import Profile
from pushpull.sim.config import ClusterConfig, Compression


@dataclass(frozen=True)
class ReadyTensor:
    """One gradient tensor becoming ready during the backward pass."""
    index: int        # global tensor index in forward order
    layer: int        # forward-order layer index (0 = input side)
    pos: int          # position among its layer's tensors
    name: str
    nbytes: int
    numel: int
    ready_s: float    # seconds after the backward started


@dataclass
class CommTask:
    """A unit of communication: one reduction of ``parts``.

    ``parts`` are (tensor index, bytes) pieces carried; a tensor may be split
    over several tasks (partitions) or several tensors fused into one task.
    ``priority`` orders the queue when the discipline is by priority (lower
    first); otherwise release order (then creation order) is used.
    """
    name: str
    release_s: float
    parts: list[tuple[int, int]]
    priority: tuple = ()

    @property
    def nbytes(self) -> int:
        return sum(b for _, b in self.parts)


@dataclass(frozen=True)
class Discipline:
    """How released tasks are admitted to the network.

    ``credit_bytes``: a task is admitted while the bytes in flight are below
    it (None = unlimited); nothing admitted is ever pre-empted.
    ``credit_release``: when a task's credit comes back: ``"done"`` when it
    is reduced, ``"push"`` when the servers acknowledged every push of it
    (pushpull's and BytePS' worker engine: holding credit until the pull,
    which waits for the slowest worker, would deadlock workers that admit in
    different orders).
    """
    by_priority: bool = False
    credit_bytes: float | None = None
    credit_release: str = "done"


@dataclass
class StrategyContext:
    """Everything a strategy may look at when it plans one iteration."""
    profile: Profile
    cluster: ClusterConfig
    ready: list[ReadyTensor]          # in the order the backward produces them
    layer_ready_s: list[float]        # per forward-order layer
    backward_s: float


@dataclass
class Strategy:
    compression: Compression | None = field(default=None, kw_only=True)
    name: ClassVar[str] = "?"

    def tasks(self, ctx: StrategyContext) -> list[CommTask]:  # pragma: no cover - abstract
        raise NotImplementedError

    def discipline(self, cluster: ClusterConfig) -> Discipline:
        return Discipline()

    def ps_key_bytes(self, cluster: ClusterConfig) -> int:
        """Size of the PS keys a task is sharded into (one push and one pull each)."""
        return cluster.ps_partition_bytes

    def describe(self) -> str:
        return self.name


def group_name(prefix: str, j: int, members: list[ReadyTensor]) -> str:
    """Track name for a buffer of several tensors: ``fusion3[fc.bias..fc.weight]``."""
    if len(members) == 1:
        return f"{prefix}{j}[{members[0].name}]"
    return f"{prefix}{j}[{members[0].name}..{members[-1].name}]"
