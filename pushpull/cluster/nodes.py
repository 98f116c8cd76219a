"""Node ids used in the header's ``sender`` field.

Workers are their rank (0..n-1); servers are ``SERVER_BASE + server rank``; the
scheduler is ``SCHEDULER``. Helper functions turn ids into names for errors.
"""
SCHEDULER = -1
SERVER_BASE = 1_000_000


def server_node(rank: int) -> int:
    return SERVER_BASE + rank


def describe(node: int) -> str:
    if node == SCHEDULER:
        return "scheduler"
    if node >= SERVER_BASE:
        return f"server {node - SERVER_BASE}"
    return f"worker rank {node}"
