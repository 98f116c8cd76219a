"""One launch per cluster shape, one reported test per case: the helpers tests/cluster/test_pushpull.py and
tests/cluster/test_torch_api.py share (their workers print ``case <name> ok on rank ...`` per case and rank)."""
from __future__ import annotations

import pytest


def shape_runner(launch_shape):
    """A memoizing ``run(shape) -> (workers, output)`` around ``launch_shape(shape)``, which launches the
    shape's job and returns (workers, its CompletedProcess)."""
    runs: dict = {}

    def run(shape: str) -> tuple[int, str]:
        if shape not in runs:
            workers, res = launch_shape(shape)
            runs[shape] = (workers, res.stdout + res.stderr)
        return runs[shape]
    return run


def assert_case(out: str, case: str, workers: int) -> None:
    """Every worker reported ``case`` ok; else fail with that case's lines and the end of the output."""
    ok = out.count(f"case {case} ok on rank")
    if ok != workers:
        lines = [ln for ln in out.splitlines() if f"case {case} " in ln or "FAIL" in ln or "Error" in ln]
        pytest.fail(f"case {case!r} passed on {ok} of {workers} workers:\n" + "\n".join(lines[-30:]) + "\n---\n"
                    + out[-2500:])
