"""Processes of this job for a test worker to kill (tests/scripts/elastic_worker.py, diloco_worker.py)."""
import os
import signal
from pathlib import Path

import pushpull.torch as bps


def kill_a_server() -> int:
    """SIGKILL one of this job's servers (found through /proc: the same scheduler port); returns its pid."""
    port = f"DMLC_PS_ROOT_PORT={bps.config().root_port}".encode()
    for d in Path("/proc").iterdir():
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            if d.name.isdigit() and port in env and b"DMLC_ROLE=server" in env:
                print(f"VICTIM server pid {d.name} dies now", flush=True)
                os.kill(int(d.name), signal.SIGKILL)
                return int(d.name)
        except OSError:
            continue
    raise RuntimeError("no server found")
