"""This machine's processes found through /proc by their command line and environment: how a cluster test finds
its own job's schedulers and servers (to see that none outlived the job) or the process it SIGKILLs."""
from __future__ import annotations

import os
from pathlib import Path


def pids(match) -> list[int]:
    """The other processes for which ``match(cmdline, environ)`` is true, both the bytes /proc gives (NUL after
    every argument and every ``KEY=VALUE``); a process that ends or denies a read on the way is left out."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if match((d / "cmdline").read_bytes(), (d / "environ").read_bytes()):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def roles(env_has: bytes) -> list[int]:
    """The schedulers and servers (``python -m pushpull.launch.role``) whose environment contains ``env_has``."""
    return pids(lambda cmd, env: b"pushpull.launch.role" in cmd and env_has in env)
