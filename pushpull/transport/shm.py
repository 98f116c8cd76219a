"""Same-host payloads through shared memory: one region per key, shared by a server and the workers of its host.

Why: over a socket, even a Unix one, a push is copied twice (into the kernel by the worker, out of it by the
server) and the sum twice more for every worker; on one host those copies, not the sums, are most of what a
step costs. With a region per key, a worker copies its partition once into its own slot, the server sums
straight from the slots into the region's output, and every worker reads the sum from there. The socket still
carries a header per push and per answer: it orders the exchange, authenticates who pushed, and wakes the peer.

Layout: ``workers`` push slots, then ``OUTS`` outputs (a server's rounds are double-buffered: round r's sum is
in output r % 2), each ``stride`` bytes (the key's bytes rounded up to a page). A rank writes only its slot, and
only after the answer of its previous push of the key: the server has then finished reading it.

Security (docs/security.md): the file lives in /dev/shm, is created exclusively (``O_EXCL``, ``O_NOFOLLOW``)
with mode 0600 under a name with 128 random bits, and that name only travels in an INIT_ACK over the
authenticated socket. A worker maps a region only if its name has the expected form, and the file is a regular
file owned by this user, with mode 0600, of exactly the announced size. The server reserves the memory when it
creates the file (``posix_fallocate``), so a full /dev/shm makes it answer over the socket instead. Without the
reservation, writing to the region later would crash the process with SIGBUS. It keeps a share of /dev/shm free
for the rest of the machine. The server unlinks the file once every rank has pushed through it (the mappings
stay valid), and at exit, so a crash after the first round leaves nothing behind.
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
PAGE = 4096
OUTS = 2  # outputs per key: a server keeps two rounds (pushpull.server.keystate)
# keys up to this size keep their payload on the socket: a copy into shared memory costs about what the
# socket's copies do for them, and such keys are summed on the server's receiving thread, batched on the wire
MIN_KEY_BYTES = 65536
# what a server leaves free in /dev/shm for the rest of the machine (data loaders use it too): the larger of
HEADROOM_BYTES, HEADROOM_FRACTION = 256 << 20, 0.25
_NAME = re.compile(r"pushpull-[0-9a-f]{32}-k[0-9]{1,20}")


def available() -> bool:
    """Whether this machine has a shared-memory file system where regions can live."""
    return os.path.isdir(SHM_DIR)


def _stride(nbytes: int) -> int:
    return (max(nbytes, 1) + PAGE - 1) // PAGE * PAGE


class Region:
    """One key's mapped region: ``push(rank)`` and ``out(i)`` are uint8 views of ``nbytes`` bytes each."""

    def __init__(self, mm: mmap.mmap, nbytes: int, workers: int, path: str):
        self.mm = mm
        self.nbytes = nbytes
        self.workers = workers
        self.stride = _stride(nbytes)
        self.path = path
        self.linked = True
        self._lock = threading.Lock()
        whole = np.frombuffer(mm, dtype=np.uint8)
        self.pushes = [whole[r * self.stride:r * self.stride + nbytes] for r in range(workers)]
        self.outs = [whole[(workers + i) * self.stride:(workers + i) * self.stride + nbytes] for i in range(OUTS)]

    def push(self, rank: int) -> np.ndarray:
        return self.pushes[rank]

    def out(self, index: int) -> np.ndarray:
        return self.outs[index]

    def describe(self) -> dict:
        """What a worker needs to map it (sent in the INIT_ACK)."""
        return {"name": os.path.basename(self.path), "nbytes": self.nbytes, "workers": self.workers}

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

    def create(self, key: int, nbytes: int, workers: int) -> Region | None:
        """A region for ``key`` (``nbytes`` per slot, ``workers`` push slots), or None (the reason is in
        ``refused``, and logged once) when /dev/shm lacks the room or refuses the file."""
        size = _stride(nbytes) * (workers + OUTS)
        try:
            st = os.statvfs(self.dir)
        except OSError as e:
            return self._refuse(f"{self.dir} cannot be inspected ({e})")
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        keep = max(HEADROOM_BYTES, int(HEADROOM_FRACTION * total))
        if size > free - keep:
            return self._refuse(f"{self.dir} has {free >> 20} MiB free and keeps {keep >> 20} MiB for others; "
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
        region = Region(mm, nbytes, workers, path)
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


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class AttachError(Exception):
    """A region a worker will not map (it then keeps its payloads on the socket); the text says why."""


def attach(desc: dict, nbytes: int, workers: int, directory: str = SHM_DIR) -> Region:
    """Map the region a server announced for a key of ``nbytes`` bytes with ``workers`` push slots, after
    checking that it is what it should be (module docstring); :class:`AttachError` otherwise."""
    name = desc.get("name") if isinstance(desc, dict) else None
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise AttachError(f"unexpected region name {name!r}")
    if desc.get("nbytes") != nbytes or desc.get("workers") != workers:
        raise AttachError(f"region {name} is for {desc.get('nbytes')} bytes and {desc.get('workers')} workers, "
                          f"the key has {nbytes} and the job {workers}")
    path = os.path.join(directory, name)
    size = _stride(nbytes) * (workers + OUTS)
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
    return Region(mm, nbytes, workers, path)
