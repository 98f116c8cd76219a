"""CPU-seconds per byte of the primitives the data path is made of, on *this* machine
(``pushpull bench probe``; the simulator's :class:`pushpull.sim.config.CpuCosts`).

Every figure is CPU time (user + sys of the measuring process, all its threads: ``resource.getrusage``)
divided by the bytes it moved, so it does not depend on how busy the other cores are; a shared, noisy
machine still shifts it through cache and frequency effects, hence the median of ``reps`` runs.

* ``cpu_tcp_send`` / ``cpu_tcp_recv``: two processes over loopback TCP, ``sendall`` of 1 MiB blocks on one
  side, ``recv_into`` a preallocated buffer on the other (gloo's ring moves bytes this way). On loopback the
  kernel runs much of the receive path in the *sender's* context (the packet is delivered in the sending
  system call), so the sender's figure holds part of what a real NIC would charge the receiver; their sum
  is the per-byte cost of one hop, and the simulator only ever charges both ends of every hop.
* ``cpu_zmq_send`` / ``cpu_zmq_recv``: the same through ZeroMQ PUSH/PULL sockets (pyzmq, 1 MiB frames,
  ``copy=False``), as pushpull's worker and server move bytes: libzmq's I/O thread is counted in its process.
* ``cpu_curve_send`` / ``cpu_curve_recv``: the same with ZeroMQ CURVE (PUSHPULL_AUTH=curve; ``auto``
  between machines), stored as the *extra* cost over plain ZeroMQ.
* ``cpu_sum``: numpy float32 ``add(acc, x, out=acc)`` per byte of ``x`` (a server summing a push, a ring rank
  reducing a chunk).
* ``cpu_aesgcm_encrypt`` / ``cpu_aesgcm_decrypt``: AES-128-GCM of 1 MiB blocks with the ``cryptography``
  package's ``AESGCM.encrypt_into`` / ``decrypt_into`` (no allocation per block), in one process.

The ring's cost is a model of these primitives (a rank sends and receives ``2(n-1)/n M`` and sums
``(n-1)/n M`` per all-reduce of ``M``), not a gloo measurement.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import socket
import statistics
import time

MiB = 1 << 20
BLOCK = MiB


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- the receiving side, in a child process -------------------------------------------------------

def _tcp_receiver(port_q, out_q) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    got = 0
    c0 = None
    while True:  # to the sender's end of stream: closing with bytes unread would reset its last sendall
        n = conn.recv_into(view)
        if n == 0:
            break
        if c0 is None:
            c0, got0 = _cpu(), got
        got += n
    out_q.put((_cpu() - c0, got - got0))
    conn.close()
    srv.close()


def _zmq_receiver(port_q, out_q, nbytes: int, curve: bool, keys) -> None:
    import zmq

    ctx = zmq.Context(1)
    s = ctx.socket(zmq.PULL)
    if curve:
        s.curve_server = True
        s.curve_secretkey, s.curve_publickey = keys[1], keys[0]
    port = s.bind_to_random_port("tcp://127.0.0.1")
    port_q.put(port)
    got = 0
    s.recv(copy=False)                      # the first frame starts the clock (handshake excluded)
    c0 = _cpu()
    while got < nbytes:
        got += len(s.recv(copy=False).buffer)
    out_q.put((_cpu() - c0, got))
    s.close(linger=0)
    ctx.term()


def _pair(kind: str, nbytes: int) -> tuple[float, float]:
    """(sender s/byte, receiver s/byte) of one transfer of ``nbytes`` between two processes."""
    ctx = mp.get_context("fork")
    port_q, out_q = ctx.Queue(), ctx.Queue()
    payload = bytes(BLOCK)
    if kind == "tcp":
        p = ctx.Process(target=_tcp_receiver, args=(port_q, out_q), daemon=True)
        p.start()
        port = port_q.get(timeout=30)
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(payload)                  # warm-up block: the receiver's clock starts after it
        c0 = _cpu()
        for _ in range(nbytes // BLOCK):
            c.sendall(payload)
        send = _cpu() - c0
        c.shutdown(socket.SHUT_WR)          # the receiver reads to here
        recv, got = out_q.get(timeout=120)
        c.close()
        sent = nbytes
    else:
        import zmq

        curve = kind == "curve"
        server_keys = zmq.curve_keypair() if curve else None
        p = ctx.Process(target=_zmq_receiver, args=(port_q, out_q, nbytes, curve, server_keys), daemon=True)
        p.start()
        port = port_q.get(timeout=30)
        zctx = zmq.Context(1)
        s = zctx.socket(zmq.PUSH)
        s.sndhwm = 4
        if curve:
            s.curve_serverkey = server_keys[0]
            s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
        s.connect(f"tcp://127.0.0.1:{port}")
        frame = zmq.Frame(payload)
        s.send(frame, copy=False)
        c0 = _cpu()
        for _ in range(nbytes // BLOCK):
            s.send(payload, copy=False)
        recv, got = out_q.get(timeout=120)   # every frame has arrived: the I/O thread's work is done
        send = _cpu() - c0
        s.close(linger=0)
        zctx.term()
        sent = nbytes
    p.join(10)
    return send / sent, recv / max(1, got)


def _sum_cost(nbytes: int) -> float:
    import numpy as np

    n = 16 * MiB // 4
    acc, x = np.zeros(n, np.float32), np.ones(n, np.float32)
    np.add(acc, x, out=acc)
    c0 = _cpu()
    done = 0
    while done < nbytes:
        np.add(acc, x, out=acc)
        done += x.nbytes
    return (_cpu() - c0) / done


def _aesgcm_cost(nbytes: int) -> tuple[float, float] | None:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        return None
    aes = AESGCM(AESGCM.generate_key(bit_length=128))
    nonce = os.urandom(12)
    plain = bytes(BLOCK)
    sealed = bytearray(BLOCK + 16)
    opened = bytearray(BLOCK)
    if not hasattr(aes, "encrypt_into"):
        return None
    aes.encrypt_into(nonce, plain, None, sealed)
    blocks = max(1, nbytes // BLOCK)
    c0 = _cpu()
    for _ in range(blocks):
        aes.encrypt_into(nonce, plain, None, sealed)
    enc = _cpu() - c0
    sealed = bytes(sealed)
    c0 = _cpu()
    for _ in range(blocks):
        aes.decrypt_into(nonce, sealed, None, opened)
    dec = _cpu() - c0
    return enc / (blocks * BLOCK), dec / (blocks * BLOCK)


def measure(nbytes: int = 256 * MiB, reps: int = 3, curve: bool = True) -> dict:
    """Every primitive's CPU seconds per byte, the median of ``reps`` transfers of ``nbytes`` each."""
    nbytes = max(BLOCK, nbytes // BLOCK * BLOCK)

    def med(fn, *a):
        runs = [fn(*a) for _ in range(reps)]
        if isinstance(runs[0], tuple):
            return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0])))
        return statistics.median(runs)

    t0 = time.time()
    out: dict = {}
    out["cpu_tcp_send"], out["cpu_tcp_recv"] = med(_pair, "tcp", nbytes)
    out["cpu_zmq_send"], out["cpu_zmq_recv"] = med(_pair, "zmq", nbytes)
    if curve:
        # CURVE is slow (~10x plain): a quarter of the bytes keeps the probe short
        cs, cr = med(_pair, "curve", max(BLOCK, nbytes // 4 // BLOCK * BLOCK))
        out["cpu_curve_send"] = max(0.0, cs - out["cpu_zmq_send"])
        out["cpu_curve_recv"] = max(0.0, cr - out["cpu_zmq_recv"])
    out["cpu_sum"] = med(_sum_cost, 4 * nbytes)
    aes = _aesgcm_cost(nbytes)
    if aes is not None:
        runs = [aes] + [_aesgcm_cost(nbytes) for _ in range(reps - 1)]
        out["cpu_aesgcm_encrypt"] = statistics.median(r[0] for r in runs)
        out["cpu_aesgcm_decrypt"] = statistics.median(r[1] for r in runs)
    out["cpu_probe_bytes"] = nbytes
    out["cpu_probe_reps"] = reps
    out["cpu_probe_s"] = time.time() - t0
    return out


def describe(cpu: dict) -> list[str]:
    """The figures as printed lines, CPU seconds per GB (1e9 bytes)."""
    g = lambda k: cpu.get(k, float("nan")) * 1e9   # noqa: E731
    lines = [f"  socket, loopback TCP (sendall / recv_into): send {g('cpu_tcp_send'):.2f}, receive "
             f"{g('cpu_tcp_recv'):.2f} CPU-s/GB",
             f"  ZeroMQ PUSH/PULL (the PS data path):       send {g('cpu_zmq_send'):.2f}, receive "
             f"{g('cpu_zmq_recv'):.2f} CPU-s/GB"]
    if "cpu_curve_send" in cpu:
        lines.append(f"  ZeroMQ CURVE, extra over plain:            send {g('cpu_curve_send'):.2f}, receive "
                     f"{g('cpu_curve_recv'):.2f} CPU-s/GB")
    if "cpu_aesgcm_encrypt" in cpu:
        lines.append(f"  AES-128-GCM (encrypt_into / decrypt_into): encrypt {g('cpu_aesgcm_encrypt'):.2f}, "
                     f"decrypt {g('cpu_aesgcm_decrypt'):.2f} CPU-s/GB")
    lines.append(f"  float32 sum (numpy add, out=):             {g('cpu_sum'):.2f} CPU-s/GB")
    return lines


def roles(cpu: dict, workers: int, servers: int, encryption: str = "auto", data_lane: bool | None = None) -> list[str]:
    """What the primitives mean per role (CPU-s per GB of gradient), for the printout. ``data_lane``: the
    PS's data goes on lanes (plain sockets; AES-GCM where ``auto`` encrypts); None: as this process's
    settings give (PUSHPULL_DATA_LANE, by default lanes for keys of 1 MiB and more)."""
    from pushpull.config import data_lane_on, load_config
    from pushpull.sim.config import CpuCosts

    if data_lane is None:
        data_lane = data_lane_on(load_config())
    c = CpuCosts.from_probe(cpu, encryption=encryption, data_lane=data_lane)
    n, k = workers, servers
    ring = c.ring_cpu_s(n, 1e9)
    ps_total = n * (c.worker_push + c.worker_pull + c.server_push + c.server_pull) * 1e9
    path = "data lanes" if data_lane else "ZeroMQ"
    return [f"  per role ({encryption} encryption on the PS, over {path}): PS worker push {c.worker_push * 1e9:.2f} + pull "
            f"{c.worker_pull * 1e9:.2f}; PS server per worker's push {c.server_push * 1e9:.2f} + pull answer "
            f"{c.server_pull * 1e9:.2f}; ring rank {ring:.2f} per GB all-reduced (n={n})",
            f"  all processes together, per GB of gradient: PS {ps_total:.2f} CPU-s (n={n}, k={k}), ring "
            f"{n * ring:.2f} CPU-s"]
