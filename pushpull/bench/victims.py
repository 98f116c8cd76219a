"""A job's processes for a test or a benchmark to kill (elastic training, chaos): found through /proc by
the scheduler port in their environment, so only this job's are ever touched."""
from __future__ import annotations

import os
import signal
from pathlib import Path


def kill_a_server(root_port: int) -> int:
    """SIGKILL one of the servers of the job whose scheduler listens on ``root_port``; returns its pid."""
    port = f"DMLC_PS_ROOT_PORT={root_port}".encode()
    for d in Path("/proc").iterdir():
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            if d.name.isdigit() and port in env and b"DMLC_ROLE=server" in env:
                print(f"VICTIM server pid {d.name} dies now", flush=True)
                os.kill(int(d.name), signal.SIGKILL)
                return int(d.name)
        except OSError:
            continue
    raise RuntimeError(f"no server of the job at port {root_port} found")
