"""Link delay without ``netem``: hold packets in an NFQUEUE for a fixed time.

Some kernels (minimal VM kernels, e.g. Firecracker guests) ship ``tbf`` but not
``sch_netem``. There the switch namespace sends every bridged IPv4 packet to an
NFQUEUE (an ``iptables ... -j NFQUEUE`` rule, with ``br_netfilter``), and this
process, running inside the switch namespace, accepts each packet ``delay``
seconds after it was queued.

Only metadata crosses into user space (copy mode META, GSO packets unsplit),
and since every packet waits the same time, one *batch* verdict releases all
packets up to an id: the cost is a few syscalls per millisecond, not per
packet. Packets that arrive while the queue is full are dropped by the kernel,
as a switch with a full buffer would.

Speaks the nfnetlink_queue protocol directly over an AF_NETLINK socket (no
libnetfilter_queue binding needed).
"""
from __future__ import annotations

import argparse
import collections
import errno
import logging
import os
import select
import signal
import socket
import struct
import sys
import time

log = logging.getLogger(__name__)

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")
NFGEN_HDR = struct.Struct("=BBH")  # family, version, res_id (big-endian, packed by hand)


def _attr(atype: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, atype) + payload + b"\0" * ((4 - n % 4) % 4)


class NfQueue:
    """A bound NFQUEUE: receive packet ids, issue batch verdicts."""

    def __init__(self, queue_num: int, maxlen: int = 65536, rcvbuf: int = 8 << 20):
        self.queue_num = queue_num
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((0, 0))
        self._config(_attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, socket.htons(socket.AF_INET))))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                     + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
                     + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
                     + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO)))
        self.sock.setblocking(False)

    def _msg(self, mtype: int, body: bytes, flags: int = NLM_F_REQUEST) -> bytes:
        self.seq += 1
        nfgen = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", self.queue_num)
        payload = nfgen + body
        return NLMSG_HDR.pack(NLMSG_HDR.size + len(payload), (NFNL_SUBSYS_QUEUE << 8) | mtype,
                              flags, self.seq, 0) + payload

    def _config(self, body: bytes) -> None:
        """Send a config message and check the kernel's ack."""
        self.sock.send(self._msg(NFQNL_MSG_CONFIG, body, NLM_F_REQUEST | NLM_F_ACK))
        self.sock.settimeout(5)
        data = self.sock.recv(65536)
        _len, mtype, _f, _seq, _pid = NLMSG_HDR.unpack_from(data, 0)
        if mtype == NLMSG_ERROR:
            err = struct.unpack_from("=i", data, NLMSG_HDR.size)[0]
            if err != 0:
                raise OSError(-err, f"nfqueue config failed: {os.strerror(-err)}")

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_ids(self) -> list[int]:
        """Packet ids of every queued-packet message available now."""
        ids = []
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return ids
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # messages lost; a later batch verdict covers them
                    log.warning("nfqueue: receive buffer overrun")
                    continue
                raise
            off = 0
            while off + NLMSG_HDR.size <= len(data):
                mlen, mtype, _f, _s, _p = NLMSG_HDR.unpack_from(data, off)
                if mlen < NLMSG_HDR.size:
                    break
                if mtype == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    a = off + NLMSG_HDR.size + NFGEN_HDR.size
                    end = off + mlen
                    while a + 4 <= end:
                        alen, atype = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if (atype & 0x7FFF) == NFQA_PACKET_HDR:
                            ids.append(struct.unpack_from("!I", data, a + 4)[0])
                            break
                        a += (alen + 3) & ~3
                off += (mlen + 3) & ~3

    def accept_upto(self, packet_id: int) -> None:
        body = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
        while True:
            try:
                self.sock.send(self._msg(NFQNL_MSG_VERDICT_BATCH, body))
                return
            except BlockingIOError:
                select.select([], [self.sock], [], 0.01)

    def close(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.send(self._msg(NFQNL_MSG_CONFIG, _attr(
                NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_UNBIND, 0, socket.htons(socket.AF_INET)))))
        except OSError:
            pass
        self.sock.close()


def _tighten_timing() -> None:
    """Wake up on time: 1 ns timer slack (default 50 µs) and real-time priority.

    Every microsecond this process oversleeps is added to the emulated delay.
    The loop blocks in select(), so a real-time priority cannot starve others.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        pass


def run(queue_num: int, delay_s: float, ready_fd: int | None = None) -> None:
    """Hold each packet of ``queue_num`` for ``delay_s``; runs until SIGTERM."""
    q = NfQueue(queue_num)
    _tighten_timing()
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    else:
        print("ready", flush=True)
    pending: collections.deque[tuple[float, int]] = collections.deque()
    clock = time.monotonic
    # Waking up costs time (timer + scheduler, far more inside a VM): wake
    # early by the lateness seen so far (EWMA), so packets leave on time on
    # average rather than always late.
    comp = 0.0
    max_comp = 0.5 * delay_s
    late_sum = late_max = 0.0
    released = 0
    while not stop:
        target = pending[0][0] - comp if pending else None
        timeout = max(0.0, target - clock()) if pending else 0.5
        r, _, _ = select.select([q], [], [], timeout)
        now = clock()
        if target is not None and not r and now >= target:
            comp = min(max_comp, 0.9 * comp + 0.1 * (now - target))
        if r:
            for pid in q.read_ids():
                pending.append((now + delay_s, pid))
        last = None
        while pending and pending[0][0] - comp <= now:
            rel, last = pending.popleft()
            late_sum += now - rel
            late_max = max(late_max, now - rel)
            released += 1
        if last is not None:
            q.accept_upto(last)
    if pending:  # do not strand packets on the way out
        q.accept_upto(pending[-1][1])
    q.close()
    if released:
        log.info("released %d packets, late by %.1f us on average, %.1f us at most (waking %.1f us early)",
                 released, late_sum / released * 1e6, late_max * 1e6, comp * 1e6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pushpull.emulate.delayer")
    ap.add_argument("--queue", type=int, default=0)
    ap.add_argument("--delay", type=float, required=True, help="seconds")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="delayer: %(message)s")
    run(a.queue, a.delay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
