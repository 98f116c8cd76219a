"""Shared-memory regions for same-host workers (pushpull.transport.shm) and a server key that sums into one:
what a worker agrees to map, what a server refuses to create, and where each round's result lands."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pushpull.server.keystate import KeyState
from pushpull.transport import shm


@pytest.fixture
def regions(tmp_path):
    r = shm.Regions(str(tmp_path))
    yield r
    r.unlink_all()


def test_a_worker_sees_what_the_server_writes_and_the_other_way(regions, tmp_path):
    server = regions.create(7, 100_000, slots=3)
    worker, slot = shm.attach(server.describe(2), 100_000, 3, str(tmp_path))
    assert slot == 2
    worker.push(slot)[:] = 5
    assert (server.push(2) == 5).all() and (server.push(1) == 0).all()
    server.out(1)[:] = 9
    assert (worker.out(1) == 9).all() and (worker.out(0) == 0).all()


def test_the_file_is_private_to_this_user(regions):
    region = regions.create(7, 100_000, slots=2)
    assert os.stat(region.path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("change,workers", [({"nbytes": 99_999}, 3), ({"slot": 2}, 3), ({"slot": -1}, 3),
                                            ({"slots": 3}, 2), ({"slot": "0"}, 3)])
def test_a_region_the_announcement_does_not_match_is_refused(regions, tmp_path, change, workers):
    desc = {**regions.create(7, 100_000, slots=2).describe(0), **change}
    with pytest.raises(shm.AttachError, match="the key has 100000 bytes"):
        shm.attach(desc, 100_000, workers, str(tmp_path))


@pytest.mark.parametrize("name", ["../etc/passwd", "pushpull-abc-k1", "pushpull-" + "0" * 32 + "-k1/../x", None])
def test_a_name_of_another_form_is_refused_before_any_open(tmp_path, name):
    with pytest.raises(shm.AttachError, match="unexpected region name"):
        shm.attach({"name": name, "nbytes": 100_000, "slots": 2, "slot": 0}, 100_000, 2, str(tmp_path))


def test_a_file_others_can_read_is_refused(regions, tmp_path):
    region = regions.create(7, 100_000, slots=2)
    os.chmod(region.path, 0o644)
    with pytest.raises(shm.AttachError, match="mode 0600"):
        shm.attach(region.describe(0), 100_000, 2, str(tmp_path))


def test_a_file_of_another_size_is_refused(regions, tmp_path):
    region = regions.create(7, 100_000, slots=2)
    os.truncate(region.path, 4096)
    with pytest.raises(shm.AttachError, match="4096 bytes"):
        shm.attach(region.describe(0), 100_000, 2, str(tmp_path))


def test_a_symbolic_link_is_not_followed(tmp_path):
    name = "pushpull-" + "a" * 32 + "-k1"
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * 4096 * 4)
    os.symlink(target, tmp_path / name)
    with pytest.raises(shm.AttachError, match="cannot be opened"):
        shm.attach({"name": name, "nbytes": 4096, "slots": 2, "slot": 0}, 4096, 2, str(tmp_path))


def test_a_missing_file_says_which_shm_it_looked_in(tmp_path):
    name = "pushpull-" + "b" * 32 + "-k1"
    with pytest.raises(shm.AttachError, match="server's /dev/shm"):
        shm.attach({"name": name, "nbytes": 4096, "slots": 2, "slot": 0}, 4096, 2, str(tmp_path))


def test_the_server_keeps_room_for_the_rest_of_the_machine(regions, monkeypatch):
    free = os.statvfs(regions.dir).f_bavail * os.statvfs(regions.dir).f_frsize
    monkeypatch.setattr(shm, "HEADROOM_BYTES", free)  # nothing may be taken
    assert regions.create(7, 100_000, slots=2) is None
    assert "keeps" in regions.refused and "key 7" in regions.refused
    assert not os.listdir(regions.dir)


def test_the_server_keeps_room_in_the_machines_memory(regions, monkeypatch):
    monkeypatch.setattr(shm, "_memory", lambda: (1 << 30, 1 << 32))  # 1 GiB available of 4: keeps 1 GiB
    assert regions.create(7, 100_000, slots=2) is None
    assert regions.refused.startswith("the machine's memory has 1024 MiB free and keeps 1024 MiB")
    assert not os.listdir(regions.dir)


def test_a_name_taken_already_is_not_reused(regions):
    first = regions.create(7, 100_000, slots=2)
    assert regions.create(7, 100_000, slots=2) is None  # O_EXCL: never opens a file it did not create
    assert "could not be created" in regions.refused
    assert os.path.exists(first.path)


def test_unlinking_keeps_the_mappings(regions, tmp_path):
    region = regions.create(7, 100_000, slots=2)
    worker, _ = shm.attach(region.describe(0), 100_000, 2, str(tmp_path))
    regions.unlinked(7)
    assert not os.listdir(tmp_path)
    worker.push(0)[:] = 3
    assert (region.push(0) == 3).all()


def test_every_file_still_named_goes_at_exit(regions, tmp_path):
    for key in (1, 2, 3):
        regions.create(key, 70_000, slots=2)
    regions.unlink_all()
    assert not os.listdir(tmp_path)


# ---------------------------------------------------------------- a server key over a region --

def _key(regions, dtype: str, workers: int, numel: int = 40_000) -> tuple[KeyState, shm.Region]:
    ks = KeyState(3, "w", dtype, numel, workers)
    ks.shm = regions.create(3, ks.wire_nbytes, workers)
    ks.shm_slot = {r: r for r in range(workers)}
    return ks, ks.shm


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_each_rounds_sum_lands_in_the_output_of_its_slot(regions, dtype):
    ks, region = _key(regions, dtype, workers=2)
    for rnd in (1, 2, 3):
        for rank in (0, 1):
            region.push(rank).view(dtype)[:] = rnd * (rank + 1)
            done = ks.push(rnd, rank, region.push(rank).view(dtype))
        assert done is not None and done.out.ctypes.data == region.out(rnd % 2).ctypes.data
        assert (region.out(rnd % 2).view(dtype) == 3 * rnd).all()
        for rank in (0, 1):
            ks.pull(rnd, rank)
            done.pulled.add(rank)


def test_one_workers_push_is_copied_to_the_output(regions):
    ks, region = _key(regions, "float32", workers=1)
    region.push(0).view(np.float32)[:] = 4.5
    done = ks.push(1, 0, region.push(0).view(np.float32))
    assert (region.out(1).view(np.float32) == 4.5).all() and done.out.ctypes.data == region.out(1).ctypes.data


# ---------------------------------------------------------------- a container's memory limit --

def _cgroup(tmp_path, monkeypatch, self_cgroup: str, files: dict) -> None:
    (tmp_path / "self").write_text(self_cgroup)
    for rel, text in files.items():
        (tmp_path / "root" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / rel).write_text(text)
    monkeypatch.setattr(shm, "SELF_CGROUP", str(tmp_path / "self"))
    monkeypatch.setattr(shm, "CGROUP_ROOT", str(tmp_path / "root"))


def test_a_cgroup_v2_limit_is_read(tmp_path, monkeypatch):
    _cgroup(tmp_path, monkeypatch, "0::/job/a\n", {"job/a/memory.max": "1073741824\n",
                                                   "job/a/memory.current": "268435456\n"})
    assert shm._cgroup_memory() == (1 << 30, 1 << 28)
    avail, total = shm._memory()
    assert avail <= (1 << 30) - (1 << 28) and total <= 1 << 30


def test_a_cgroup_v1_limit_is_read(tmp_path, monkeypatch):
    _cgroup(tmp_path, monkeypatch, "5:cpu:/\n4:memory:/job/b\n0::/\n",
            {"memory/job/b/memory.limit_in_bytes": "2147483648\n", "memory/job/b/memory.usage_in_bytes": "1024\n"})
    assert shm._cgroup_memory() == (1 << 31, 1024)


@pytest.mark.parametrize("limit", ["max\n", "9223372036854771712\n"])
def test_no_cgroup_limit_leaves_the_machines_memory(tmp_path, monkeypatch, limit):
    _cgroup(tmp_path, monkeypatch, "0::/job/c\n", {"job/c/memory.max": limit, "job/c/memory.current": "1\n"})
    assert shm._cgroup_memory() is None
