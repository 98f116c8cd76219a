"""Node ids used in the header's ``sender`` field.

Workers are their rank (0..n-1); servers are ``SERVER_BASE + server rank``; the
scheduler is ``SCHEDULER``. Helper functions turn ids into names for errors.
"""
import re

SCHEDULER = -1
SERVER_BASE = 1_000_000
_WORKER_IDENTITY = re.compile(rb"w(\d{1,9})(?:\.[a-z0-9]{1,16})?")


def server_node(rank: int) -> int:
    return SERVER_BASE + rank


def describe(node: int) -> str:
    if node == SCHEDULER:
        return "scheduler"
    if node >= SERVER_BASE:
        return f"server {node - SERVER_BASE}"
    return f"worker rank {node}"


def worker_identity(rank: int, channel: str = "") -> bytes:
    """The ZeroMQ identity of a worker's connection to a server: ``w<rank>``, or ``w<rank>.<channel>`` for
    a second connection (the direct path's, one per thread). A ROUTER refuses a second live connection
    with an identity already in use, so the rank in it is the connection's own."""
    return f"w{rank}.{channel}".encode() if channel else f"w{rank}".encode()


def rank_of_identity(identity: bytes) -> int | None:
    """The rank a worker connection was opened for, or None if it is not a worker identity."""
    m = _WORKER_IDENTITY.fullmatch(identity)
    return int(m.group(1)) if m else None
