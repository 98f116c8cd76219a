"""Same-host payloads through shared memory (PUSHPULL_LOCAL_SHM; pushpull.transport.shm), in real jobs: real
launcher, scheduler, servers and workers on this host. Sums must be the socket path's, in every dtype and op,
over rounds; the regions must be used when on and not when off, and leave no file behind."""
from __future__ import annotations

import glob
import re

import pytest

from cluster.test_pushpull import launch

SHM_ENV = {"PUSHPULL_LOCAL_SHM": "1"}
SHAPES = {
    "3w-2s": (3, 2, SHM_ENV),
    "2w-1s-engines0": (2, 1, {**SHM_ENV, "BYTEPS_SERVER_ENGINE_THREAD": "0"}),
    "1w-1s": (1, 1, {**SHM_ENV, "BYTEPS_FORCE_DISTRIBUTED": "1"}),  # one push: the sum is that push, copied
    "3w-2s-off": (3, 2, {"PUSHPULL_LOCAL_SHM": "0"}),
    "3w-2s-tcp": (3, 2, {**SHM_ENV, "PUSHPULL_LOCAL_IPC": "0"}),  # no Unix socket: no shared memory either
    "2w-1s-curve": (2, 1, {**SHM_ENV, "PUSHPULL_AUTH": "curve"}),  # encryption asked: payloads stay encrypted
}


@pytest.fixture(scope="module")
def runs():
    done: dict = {}

    def run(shape: str) -> tuple[int, str]:
        if shape not in done:
            before = set(glob.glob("/dev/shm/pushpull-*"))
            workers, servers, env = SHAPES[shape]
            res = launch(workers, servers, "shm", env=env, timeout=180)
            left = set(glob.glob("/dev/shm/pushpull-*")) - before
            done[shape] = (workers, res.returncode, res.stdout + res.stderr, left)
        return done[shape]
    return run


def _shm_pushes(out: str) -> dict[int, int]:
    return {int(r): int(c) for r, c in re.findall(r"SHM-PUSHES rank (\d+): (\d+)", out)}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_sums_are_exact_in_every_dtype_and_op(runs, shape):
    workers, code, out, _ = runs(shape)
    assert code == 0 and out.count("case shm ok on rank") == workers, out[-4000:]


@pytest.mark.parametrize("shape", ["3w-2s", "2w-1s-engines0", "1w-1s"])
def test_large_keys_go_through_shared_memory_when_on(runs, shape):
    workers, _, out, _ = runs(shape)
    pushes = _shm_pushes(out)
    assert sorted(pushes) == list(range(workers)), out[-3000:]
    # per round: 6 dtypes x (sum, avg) + min + max + 3 partitions of the big tensor = 17 keys, 4 rounds
    assert all(c == 17 * 4 for c in pushes.values()), pushes


@pytest.mark.parametrize("shape", ["3w-2s-off", "3w-2s-tcp", "2w-1s-curve"])
def test_every_payload_stays_on_the_socket_when_off_over_tcp_or_encrypted(runs, shape):
    workers, _, out, _ = runs(shape)
    assert _shm_pushes(out) == {r: 0 for r in range(workers)}, out[-3000:]


@pytest.mark.parametrize("shape", ["3w-2s", "1w-1s"])
def test_regions_are_unlinked_after_the_first_round(runs, shape):
    workers, _, out, _ = runs(shape)
    named = re.findall(r"SHM-NAMED-AFTER-ROUND-2 rank \d+: (\d+)", out)
    assert named == ["0"] * workers, out[-3000:]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_region_file_is_left_behind(runs, shape):
    _, _, _, left = runs(shape)
    assert not left
