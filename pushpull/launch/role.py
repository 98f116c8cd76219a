"""Run the scheduler or a server in this process: ``python -m pushpull.launch.role scheduler|server``."""
from __future__ import annotations

import logging
import signal
import sys

from pushpull.config import ConfigError, load_config, python_log_level

# how long a scheduler or server may take to exit after SIGTERM before the kernel ends it (SIGALRM)
EXIT_GRACE_S = 5


def exit_on_sigterm(*_) -> None:
    """SIGTERM (the launcher ending the job, or dying: PR_SET_PDEATHSIG): exit cleanly, so that at-exit
    handlers run (a server unlinks its shared memory), but within EXIT_GRACE_S. A finalizer that blocks must
    not keep the process alive after its launcher: pyzmq's zero-copy garbage collector was seen blocking
    forever in a send during interpreter shutdown. Once shutdown has begun, no Python thread can run, so the
    guard is a kernel timer whose signal's default action ends the process. A second SIGTERM is ignored: it
    would re-arm the timer and interrupt the at-exit handlers it lets run."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(EXIT_GRACE_S)
    sys.exit(143)


def run_role(role: str) -> int:
    try:
        cfg = load_config()
    except ConfigError as e:
        print(f"pushpull {role}: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=python_log_level(cfg), format=f"%(asctime)s {role} %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, exit_on_sigterm)
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
