"""Same-host payloads through shared memory: one region per key, shared by a server and the workers of its host.

Why: over a socket, even a Unix one, a push is copied twice (into the kernel by the worker, out of it by the
server) and the sum twice more for every worker; on one host those copies, not the sums, are most of what a
step costs. With a region per key, a worker copies its partition once into its own slot, the server sums
straight from the slots into the region's output, and every worker reads the sum from there. The socket still
carries a header per push and per answer: it orders the exchange, authenticates who pushed, and wakes the peer.

Layout: a push slot per rank that offered to share (the INIT_ACK tells each its slot), then ``OUTS`` outputs (a
server's rounds are double-buffered: round r's sum is in output r % 2), each ``stride`` bytes (the key's bytes
rounded up to a page). A rank writes only its slot, and only after the answer of its previous push of the key:
the server has then finished reading it.

Security (docs/security.md): the file lives in /dev/shm, is created exclusively (``O_EXCL``, ``O_NOFOLLOW``)
with mode 0600 under a name with 128 random bits, and that name only travels in an INIT_ACK over the
authenticated socket. A worker maps a region only if its name has the expected form, and the file is a regular
file owned by this user, with mode 0600, of exactly the announced size. The server reserves the memory when it
creates the file (``posix_fallocate``), so a full /dev/shm makes it answer over the socket instead. Without the
reservation, writing to the region later would crash the process with SIGBUS. It keeps a share of /dev/shm, and
of the machine's available memory, free for the rest of the machine. The server unlinks the file once every rank
it was offered to has pushed the key once (so has mapped it or given up; the mappings stay valid), and at exit,
so a crash after the first push leaves nothing behind.
"""
from __future__ import annotations

import atexit
import logging
import mmap
import os
import re
import secrets
import stat
import threading

import numpy as np

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
CGROUP_ROOT = "/sys/fs/cgroup"  # this process's memory cgroup is below it, at the path SELF_CGROUP gives
SELF_CGROUP = "/proc/self/cgroup"
PAGE = 4096
OUTS = 2  # outputs per key: a server keeps two rounds (pushpull.server.keystate)
# keys up to this size keep their payload on the socket: a copy into shared memory costs about what the
# socket's copies do for them, and such keys are summed on the server's receiving thread, batched on the wire
MIN_KEY_BYTES = 65536
# what a server leaves free in /dev/shm, and of the machine's available memory, for the rest of the machine (data
# loaders use /dev/shm too; a region's pages are reserved and cannot be swapped out): the larger of
HEADROOM_BYTES, HEADROOM_FRACTION = 256 << 20, 0.25
_NAME = re.compile(r"pushpull-[0-9a-f]{32}-k[0-9]{1,20}")


def available() -> bool:
    """Whether this machine has a shared-memory file system where regions can live."""
    return os.path.isdir(SHM_DIR)


def _stride(nbytes: int) -> int:
    return (max(nbytes, 1) + PAGE - 1) // PAGE * PAGE


class Region:
    """One key's mapped region: ``push(slot)`` and ``out(i)`` are uint8 views of ``nbytes`` bytes each."""

    def __init__(self, mm: mmap.mmap, nbytes: int, slots: int, path: str):
        self.mm = mm
        self.nbytes = nbytes
        self.slots = slots
        self.stride = _stride(nbytes)
        self.path = path
        self.linked = True
        self._lock = threading.Lock()
        whole = np.frombuffer(mm, dtype=np.uint8)
        self.pushes = [whole[r * self.stride:r * self.stride + nbytes] for r in range(slots)]
        self.outs = [whole[(slots + i) * self.stride:(slots + i) * self.stride + nbytes] for i in range(OUTS)]

    def push(self, slot: int) -> np.ndarray:
        return self.pushes[slot]

    def out(self, index: int) -> np.ndarray:
        return self.outs[index]

    def describe(self, slot: int) -> dict:
        """What the worker given push slot ``slot`` needs to map it (sent in its INIT_ACK)."""
        return {"name": os.path.basename(self.path), "nbytes": self.nbytes, "slots": self.slots, "slot": slot}

    def unlink(self) -> None:
        """Remove the name (the mappings stay valid); once."""
        with self._lock:
            if not self.linked:
                return
            self.linked = False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Regions:
    """A server's regions: creates them (:meth:`create`) and unlinks those still named at exit."""

    def __init__(self, directory: str = SHM_DIR):
        self.dir = directory
        self.prefix = f"pushpull-{secrets.token_hex(16)}"
        self.named: dict[int, Region] = {}
        self.refused: str | None = None  # why the last region could not be made (logged once)
        atexit.register(self.unlink_all)

    def create(self, key: int, nbytes: int, slots: int) -> Region | None:
        """A region for ``key`` (``nbytes`` per slot, ``slots`` push slots), or None (the reason is in
        ``refused``, and logged once) when /dev/shm or the machine's memory lacks the room, or the file is
        refused."""
        size = _stride(nbytes) * (slots + OUTS)
        try:
            st = os.statvfs(self.dir)
        except OSError as e:
            return self._refuse(f"{self.dir} cannot be inspected ({e})")
        for what, free, total in ((self.dir, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize),
                                  ("the machine's memory", *_memory())):
            keep = max(HEADROOM_BYTES, int(HEADROOM_FRACTION * total))
            if size > free - keep:
                return self._refuse(f"{what} has {free >> 20} MiB free and keeps {keep >> 20} MiB for others; "
                                    f"key {key} needs {size >> 20} MiB")
        path = os.path.join(self.dir, f"{self.prefix}-k{key}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            return self._refuse(f"{path} could not be created ({e})")
        try:
            os.posix_fallocate(fd, 0, size)  # reserve now: a later page fault on a full tmpfs would be SIGBUS
            mm = mmap.mmap(fd, size)
        except OSError as e:
            os.close(fd)
            _remove(path)
            return self._refuse(f"{size >> 20} MiB could not be reserved in {self.dir} ({e})")
        os.close(fd)
        region = Region(mm, nbytes, slots, path)
        self.named[key] = region
        return region

    def _refuse(self, why: str) -> None:
        if self.refused is None:
            log.info("shared memory for same-host workers refused, pushes go over the socket: %s", why)
        self.refused = why
        return None

    def unlinked(self, key: int) -> None:
        region = self.named.pop(key, None)
        if region is not None:
            region.unlink()

    def unlink_all(self) -> None:
        for key in list(self.named):
            self.unlinked(key)


def _memory() -> tuple[int, int]:
    """(available, total) bytes of memory for this process: the machine's (Linux's MemAvailable), or its
    container's where that is less (its memory cgroup's limit, which a region's pages are charged to);
    unbounded where unknown."""
    try:
        with open("/proc/meminfo") as f:
            fields = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f if ":" in line)}
        avail, total = fields["MemAvailable"], fields["MemTotal"]
    except (OSError, KeyError, ValueError):
        avail, total = 1 << 62, 0
    group = _cgroup_memory()
    if group is not None:
        limit, used = group
        avail, total = min(avail, limit - used), min(total, limit) if total else limit
    return avail, total


def _cgroup_memory() -> tuple[int, int] | None:
    """(limit, usage) of this process's memory cgroup (v2 ``memory.max``, or v1 ``memory.limit_in_bytes``);
    None without one or without a limit."""
    try:
        with open(SELF_CGROUP) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for hid, controllers, path in (x for x in lines if len(x) == 3):
        if hid == "0" and controllers == "":
            files = os.path.join(CGROUP_ROOT, path.lstrip("/")), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            files = os.path.join(CGROUP_ROOT, "memory", path.lstrip("/")), "memory.limit_in_bytes", \
                "memory.usage_in_bytes"
        else:
            continue
        try:
            with open(os.path.join(files[0], files[1])) as f:
                limit = f.read().strip()
            with open(os.path.join(files[0], files[2])) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # v2 says "max", v1 a huge number, for no limit
            return int(limit), used
    return None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class AttachError(Exception):
    """A region a worker will not map (it then keeps its payloads on the socket); the text says why."""


def attach(desc: dict, nbytes: int, workers: int, directory: str = SHM_DIR) -> tuple[Region, int]:
    """Map the region a server announced for a key of ``nbytes`` bytes in a job of ``workers`` workers, after
    checking that it is what it should be (module docstring): the region and this worker's push slot in it;
    :class:`AttachError` otherwise."""
    name = desc.get("name") if isinstance(desc, dict) else None
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise AttachError(f"unexpected region name {name!r}")
    slots, slot = desc.get("slots"), desc.get("slot")
    if (desc.get("nbytes") != nbytes or type(slots) is not int or type(slot) is not int
            or not 0 <= slot < slots <= workers):
        raise AttachError(f"region {name} is for {desc.get('nbytes')} bytes with slot {slot!r} of {slots!r}; "
                          f"the key has {nbytes} bytes and the job {workers} workers")
    path = os.path.join(directory, name)
    size = _stride(nbytes) * (slots + OUTS)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise AttachError(f"{path} cannot be opened ({e.strerror}): is this worker in the server's /dev/shm?") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size != size:
            raise AttachError(f"{path} is not a regular file of this user's with mode 0600 and {size} bytes "
                              f"(uid {st.st_uid}, mode {oct(st.st_mode & 0o777)}, {st.st_size} bytes)")
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return Region(mm, nbytes, slots, path), slot
