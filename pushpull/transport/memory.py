"""Keep freed message buffers in the process heap.

libzmq allocates every large received message with malloc; glibc serves
blocks of a few MiB with mmap and returns them to the kernel on free, so the
next message of the same size pays page faults and the kernel zeroing every
page: about 5 % of the CPU of a reduction on loopback. Raising the mmap and
trim thresholds makes such blocks come from, and go back to, the heap.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20    # glibc's ceiling for this knob on 64-bit
TRIM_THRESHOLD = 1 << 30     # free heap kept before any is given back
TOP_PAD = 64 << 20

_done = False


def keep_freed_buffers() -> bool:
    """Apply the thresholds once per process; False where the C library has no mallopt."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library; freed buffers go back to the kernel")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = all(mallopt(param, value) == 1 for param, value in
             ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
    if not ok:
        log.debug("mallopt refused a threshold; freed buffers may go back to the kernel")
    _done = True
    return ok
