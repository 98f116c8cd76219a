"""A hand-set key size that leaves the pipeline too few keys per server (a warning, logged once).

Why: a step's pushes and pulls overlap only between keys. The first key cannot be pulled before every worker
pushed it, and the last key is pulled after every other transfer: each costs about ``k x key / B`` on the
links that nothing hides (a fill and a drain; k servers, every worker holding a share of each server's keys,
:func:`pushpull.config.default_partition_bytes`). The step's own traffic per link is ``M / B``, and
``M = k x key x (keys per server)``, so the fill and the drain are about ``2 / (keys per server)`` of it:
with 4 keys per server, half the step's transfer time is not overlapped (on the 100 Mbit/s grid, 16 keys of
500 KB over 4 servers ran at 0.94x the ring, where the default key gave 1.38x). Below
:data:`MIN_KEYS_PER_SERVER` (8: fill and drain at most about a quarter of the transfer) the worker warns,
with the numbers, when the key size was set by hand (BYTEPS_PARTITION_BYTES / PUSHPULL_PARTITION_BYTES) and
the default would give more keys per server; the default itself is never second-guessed here.

"Keys per server" counts keys by bytes: ``M / (k x largest key)``, the step's bytes over what one server
holds of the largest keys -- many tiny tensors are many keys but no pipeline, the fill and the drain are
set by the largest keys.
"""
from __future__ import annotations

import math

MIN_KEYS_PER_SERVER = 8


def keys_per_server(tensor_bytes: list[int], partition_bytes: int, num_servers: int) -> float:
    """``M / (k x largest key)`` for tensors of ``tensor_bytes`` cut into keys of at most ``partition_bytes``."""
    sizes = [int(b) for b in tensor_bytes if b > 0]
    if not sizes or num_servers < 1:
        return math.inf
    largest = min(max(sizes), int(partition_bytes))
    return sum(sizes) / (num_servers * largest)


def few_keys_warning(tensor_bytes: list[int], partition_bytes: int, num_servers: int, default_bytes: int,
                     source: str = "BYTEPS_PARTITION_BYTES") -> str | None:
    """The warning's text, or None: fewer than MIN_KEYS_PER_SERVER keys per server with ``partition_bytes``
    where ``default_bytes`` would give more. ``source`` names the setting the user set."""
    if partition_bytes == default_bytes:
        return None
    have = keys_per_server(tensor_bytes, partition_bytes, num_servers)
    dflt = keys_per_server(tensor_bytes, default_bytes, num_servers)
    if have >= MIN_KEYS_PER_SERVER or dflt <= have:
        return None
    nkeys = sum(math.ceil(b / partition_bytes) for b in tensor_bytes if b > 0)
    total = sum(b for b in tensor_bytes if b > 0)
    return (f"{source}={partition_bytes} leaves {have:.1f} keys per server ({nkeys} keys, {total} bytes over "
            f"{num_servers} server(s)): a step's first key is pulled only after every worker pushed it and its "
            f"last after everything else, each about servers x key / bandwidth that no overlap hides, about "
            f"{min(100, round(200 / have))} % of the step's transfer time at this size (under "
            f"{MIN_KEYS_PER_SERVER} keys per server the pipeline barely overlaps push and pull). The default, "
            f"{default_bytes} bytes, gives {dflt:.1f} keys per server; unset {source} or make it smaller.")
