"""The case loop of the test workers (pp_worker, api_worker): each case reports ``case <name> ok`` or
``case <name> FAIL`` on its own line and a failed one does not stop the rest, so pytest can report one
test per case (tests/cluster_cases.py)."""
from __future__ import annotations

import os
import sys
import time


def run_cases(cases: dict, names: list[str], rank: int, size: int, shutdown) -> None:
    failed = []
    for c in names:
        t = time.monotonic()
        try:
            cases[c]()
        except Exception as e:  # noqa: BLE001 - reported per case; the test names it
            failed.append(c)
            print(f"case {c} FAIL on rank {rank}/{size}: {e!r}", flush=True)
            continue
        print(f"case {c} ok on rank {rank}/{size} in {time.monotonic() - t:.2f}s", flush=True)
    if failed:
        print(f"FAILED cases {failed} on rank {rank}", flush=True)
        sys.stdout.flush()
        os._exit(3)  # a clean exit would wait for the other workers, who may wait for this one
    shutdown()
    print("ALL-OK", flush=True)
