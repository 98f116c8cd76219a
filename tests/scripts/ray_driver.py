"""Driver for tests/cluster/test_ray.py: a local Ray cluster, a RayExecutor job, one scenario per run.

    python ray_driver.py digits   # 2 workers, 1 server: the digits example to >= 0.95 on every worker
    python ray_driver.py raises   # rank 1's function raises: the run fails naming rank 1, within seconds

Prints ``RESULT <json>`` and ``ROLE-PIDS <pids>`` (the scheduler's and servers' processes, which the test
checks are gone once this driver exits).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ray

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")


def train_digits(min_accuracy: float):
    import contextlib
    import io

    sys.path.insert(0, EXAMPLES)
    import train_digits

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_digits.main(["--json", "--no-progress", "--min-accuracy", str(min_accuracy)])
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("{") and "test_accuracy" in ln]
    return {"rank": int(os.environ["DMLC_WORKER_ID"]), "code": code, "summary": json.loads(lines[-1]) if lines else None}


def raise_on_rank_1():
    import pushpull.torch as bps

    bps.init()
    if bps.rank() == 1:
        raise ValueError("rank 1 gives up on purpose")
    time.sleep(60)  # rank 0 would wait here; the run must fail long before


def main() -> None:
    from pushpull.ray import RayExecutor

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ex = RayExecutor(num_workers=2, num_servers=1, timeout=240, env={"PUSHPULL_TIMEOUT": "30"})
    ex.start()
    print("ROLE-PIDS", " ".join(map(str, ex.role_pids())), flush=True)
    t0 = time.monotonic()
    try:
        if sys.argv[1] == "digits":
            result = {"runs": ex.run(train_digits, args=(0.95,), timeout=300)}
        else:
            try:
                ex.run(raise_on_rank_1, timeout=120)
                result = {"error": None}
            except Exception as e:  # noqa: BLE001 - the test reads it
                result = {"error": str(e)[:2000], "type": type(e).__name__}
        result["seconds"] = time.monotonic() - t0
        print("RESULT", json.dumps(result), flush=True)
    finally:
        ex.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
