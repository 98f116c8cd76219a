"""pushpull: parameter-server data-parallel training over ZeroMQ.

Layers (imports point downward only)::

    torch/  ->  worker/  ->  compression/, transport/, cluster/
    server/ ->  compression/, transport/, cluster/
    sim/, profiles, timeline: no sockets, no threads

The framework binding lives in :mod:`pushpull.torch` (import it as ``bps``).
"""

__version__ = "0.1.0"
