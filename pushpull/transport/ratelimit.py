"""Log lines a peer can cause, at most one per peer and kind every few seconds.

Why: every malformed or refused message used to log a line, so any peer that
reached a port could fill a disk or drown the one line that matters. The
first occurrence is logged at once; repeats within ``every`` seconds are
counted and the count rides on the next line that gets through.
"""
from __future__ import annotations

import logging
import time


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, every: float = 10.0, max_keys: int = 1024):
        self.logger = logger
        self.every = every
        self.max_keys = max_keys  # bounds the table itself: a flood of identities cannot grow it
        self._last: dict[object, list] = {}  # key -> [time logged, suppressed since]

    def warning(self, key, fmt: str, *args) -> bool:
        """Log ``fmt % args`` unless ``key`` logged within ``every`` s; True if it was logged."""
        now = time.monotonic()
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.every:
            seen[1] += 1
            return False
        if seen is None and len(self._last) >= self.max_keys:
            self._last.clear()
        suppressed = seen[1] if seen else 0
        self._last[key] = [now, 0]
        if suppressed:
            fmt += " (and %d similar in the last %.0fs)"
            args = (*args, suppressed, now - seen[0])
        self.logger.warning(fmt, *args)
        return True
