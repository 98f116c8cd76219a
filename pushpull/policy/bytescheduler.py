"""ByteScheduler (Peng et al., SOSP 2019): partition + priority + credit. Each gradient is submitted as
soon as it is ready (as WFBP), but cut into partitions that are queued by priority (the layer nearest the
input first) and admitted while the bytes in flight are under the credit, so a partition of an early layer
that becomes ready late overtakes everything still queued.

Defaults follow ByteScheduler: 1 M / 4 M float32 elements (partition / credit) over parameter servers,
8 M / 16 M over all-reduce. Over PS a partition is a key (one push, one pull to one server) and its credit
comes back with the push acknowledgement.
"""
from __future__ import annotations


from pushpull.policy.base import OWN, Policy, key_sizes

DEFAULTS = {  # backend -> (partition bytes, credit bytes)
    "ps": (4_000_000, 16_000_000),
    "allreduce": (32_000_000, 64_000_000),
}


def partitions(nbytes: int, partition_bytes: int) -> list[int]:
    """The sizes of the partitions a tensor of ``nbytes`` is cut into (at least one; :func:`key_sizes`)."""
    return key_sizes(nbytes, partition_bytes) or [nbytes]


class ByteScheduler(Policy):
    """partitions by priority under a credit (ByteScheduler)"""
    name = "bytescheduler"
    aliases = ("bs", "scheduled", "priority")
    order = 50
    release = "ready"
    schedules = True
    options = {"partition_bytes": None, "credit": None}
    runtime = OWN
    simulator = OWN

    @classmethod
    def scheduling(cls, backend, partition_bytes=None, credit=None, **_):
        """Given values win; ``credit`` may be ``math.inf`` (no credit: the simulator's unlimited)."""
        p, c = DEFAULTS.get(backend, DEFAULTS["ps"])
        return (partition_bytes or p, credit if credit is not None else c)
