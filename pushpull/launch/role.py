"""Run the scheduler or a server in this process: ``python -m pushpull.launch.role scheduler|server``."""
from __future__ import annotations

import logging
import signal
import sys

from pushpull.config import ConfigError, load_config, python_log_level


def run_role(role: str) -> int:
    try:
        cfg = load_config()
    except ConfigError as e:
        print(f"pushpull {role}: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=python_log_level(cfg), format=f"%(asctime)s {role} %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if role == "scheduler":
            from pushpull.cluster.scheduler import run_scheduler

            return run_scheduler(cfg)
        if role == "server":
            from pushpull.server.server import run_server

            return run_server(cfg)
    except ConfigError as e:  # no job secret, an address it cannot listen on: say so and stop
        print(f"pushpull {role}: {e}", file=sys.stderr)
        return 2
    print(f"pushpull: unknown role {role!r}; expected scheduler or server", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(run_role(sys.argv[1] if len(sys.argv) > 1 else ""))
