"""``pushpull bench allreduce``: push_pull against torch.distributed all_reduce
(gloo) in the same processes on the same tensors, plus the raw pyzmq
round-trip rate as the transport ceiling.

Tensors: ResNet-50's gradients (25.6 M parameters in 161 tensors, from the
shipped profile). Each iteration reduces all of them in place, every tensor in
flight at once (push_pull_async_inplace / all_reduce(async_op=True), both
writing into the gradient tensors as an optimizer wrapper does), then waits
for all.

Ratios printed:
* ``ratio_vs_allreduce`` = all-reduce time / push_pull time (> 1: pushpull faster);
* ``fraction_of_zmq_ceiling`` = the aggregate rate at which push_pull moves
  bytes through sockets (every worker pushes M and pulls M bytes, 2·n·M in
  all) divided by the rate two of the same processes reach bouncing the same M
  bytes in 4 MiB messages with raw pyzmq (bytes sent both ways / time), measured
  between the rounds of the same run, over the transport push_pull's workers
  reach their servers by (ipc, an abstract Unix socket, where the servers offer
  it on loopback: PUSHPULL_LOCAL_IPC; else TCP). The echo sends M bytes of distinct memory,
  as push_pull sends M bytes of gradients. Bouncing one 4 MiB buffer M / 4 MiB
  times (it can stay in the CPU cache, which no gradient exchange can count on)
  is reported beside it (``fraction_of_hot_buffer_ceiling``); on the 2-core VM
  the two are equal within their run-to-run noise;
* ``fraction_of_memory_bound`` = the memory bound / push_pull time. With servers on this host, keys over
  64 KiB move through shared memory (PUSHPULL_LOCAL_SHM), not the socket, so the socket's ceiling no longer
  bounds them; what does is memory: every worker's M bytes must be read in and its M bytes of result written
  out, 2·n·M bytes copied, at the memcpy rate rank 0 measures between the rounds (M bytes into distinct
  memory), spread over every core of the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from pushpull.cli import help_text
from pushpull.bench.jobs import join_gloo_beside, run_job

MiB = 1 << 20


def resnet50_sizes() -> list[int]:
    from pushpull.profiles import load_profile

    return [t.numel for t in load_profile("resnet50").tensors()]


# ---------------------------------------------------------------- zmq ceiling --

class ZmqEcho:
    """Raw pyzmq between ranks 0 and 1 of the job: rank 0 sends ``total_bytes``
    in ``chunk``-sized messages (``window`` in flight), rank 1 echoes them.
    Measured between the push_pull and gloo rounds, so all three see the same
    machine load. With ``ipc`` over an abstract Unix socket (the transport the
    workers use to reach servers on loopback), else over TCP.

    Rank 0 sends consecutive chunks of one ``total_bytes`` buffer (the payload's
    size in distinct memory, like the gradients push_pull sends), or with
    ``hot=True`` the same 4 MiB chunk every time (it can stay in the CPU cache)."""

    def __init__(self, rank: int, host: str, total_bytes: int, chunk: int = 4 * MiB, window: int = 8,
                 ipc: bool = False):
        import os

        import numpy as np
        import zmq

        self.rank, self.host, self.chunk, self.window, self.ipc = rank, host, chunk, window, ipc
        self.ctx = zmq.Context()
        self.port = 0  # TCP: the port; ipc: the number in the socket's name (shared with rank 0 either way)
        if rank == 1:  # bound at once on a port the OS picks: nothing can take it before rank 0 connects
            self.sock = self.ctx.socket(zmq.ROUTER)
            if ipc:
                self.port = int.from_bytes(os.urandom(7), "little")
                self.sock.bind(self._ipc_addr(self.port))
            else:
                self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock = self.ctx.socket(zmq.DEALER)
            n = max(1, total_bytes // chunk)
            self.src = np.random.default_rng(0).integers(0, 256, n * chunk, dtype=np.uint8)

    @staticmethod
    def _ipc_addr(number: int) -> str:
        return f"ipc://@pushpull-bench-echo-{number}"

    def connect(self, port: int) -> None:
        """Rank 0: connect to rank 1's port (learnt through push_pull)."""
        if self.rank == 0:
            self.sock.connect(self._ipc_addr(port) if self.ipc else f"tcp://{self.host}:{port}")

    def round(self, total_bytes: int, hot: bool = False) -> float:
        """Rank 0: seconds to bounce ``total_bytes`` there and back. Rank 1: echo them."""
        n = max(1, total_bytes // self.chunk)
        if self.rank == 1:
            for _ in range(n):
                if not self.sock.poll(60_000):
                    raise RuntimeError("zmq echo: rank 0 sent nothing for 60 s")
                self.sock.send_multipart(self.sock.recv_multipart(copy=False), copy=False)
            return 0.0
        chunks = memoryview(self.src)
        c = self.chunk
        t0 = time.perf_counter()
        sent = recv = 0
        while recv < n:
            while sent < n and sent - recv < self.window:
                self.sock.send(chunks[0:c] if hot else chunks[sent * c:(sent + 1) * c], copy=False)
                sent += 1
            if not self.sock.poll(60_000):
                raise RuntimeError("zmq echo: rank 1 did not answer within 60 s")
            self.sock.recv(copy=False)
            recv += 1
        return time.perf_counter() - t0

    def bytes_moved(self, total_bytes: int) -> int:
        return 2 * max(1, total_bytes // self.chunk) * self.chunk

    def close(self) -> None:
        """Rank 1's last echoes may still be queued when its loop ends: closing with no
        linger dropped them and left rank 0 waiting (the old intermittent hang). Linger
        until they are out, bounded."""
        self.sock.close(linger=30_000)
        self.ctx.term()


# ---------------------------------------------------------------- worker side --

def child_main(args) -> int:
    import torch
    import torch.distributed as dist

    import pushpull.torch as bps

    bps.init()
    rank, size = bps.rank(), bps.size()
    cfg = bps.config()
    sizes = resnet50_sizes()
    nbytes = sum(sizes) * 4
    # the echo takes the transport push_pull's workers reach their servers by (the same on every rank)
    addrs = bps.engine().server_addrs if bps.engine() is not None else {}
    ipc = bool(addrs) and all(a.startswith("ipc://") for a in addrs.values())
    echo = ZmqEcho(rank, cfg.root_uri, nbytes, ipc=ipc) if rank in (0, 1) else None
    port = join_gloo_beside(echo.port if echo else 0)
    if echo:
        echo.connect(port)
    tensors = [torch.randn(n) for n in sizes]
    copy_src = torch.cat(tensors).numpy().view("uint8") if rank == 0 else None
    copy_dst = copy_src.copy() if rank == 0 else None

    def memcpy_round() -> float:
        t0 = time.perf_counter()
        copy_dst[:] = copy_src
        return time.perf_counter() - t0

    def pp_round() -> float:
        t0 = time.perf_counter()
        hs = [bps.push_pull_async_inplace(t, average=True, name=f"g{i}", priority=-i) for i, t in enumerate(tensors)]
        for h in hs:
            bps.synchronize(h)
        return time.perf_counter() - t0

    def ar_round() -> float:
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        return time.perf_counter() - t0

    for _ in range(2):  # declares keys; the servers' sums are double-buffered, so two rounds touch both
        pp_round()
    ar_round()
    if echo:
        echo.round(nbytes)
        echo.round(nbytes, hot=True)
    pp, ar, zq, zh, mc = [], [], [], [], []
    for _ in range(args.repeat):  # interleave so that all three see the same machine load
        bps.barrier()
        pp.append(pp_round())
        dist.barrier()
        ar.append(ar_round())
        dist.barrier()
        if echo:
            zq.append(echo.round(nbytes))
            zh.append(echo.round(nbytes, hot=True))
        if rank == 0:
            mc.append(memcpy_round())
        dist.barrier()
    dist.barrier()  # rank 0 has every echo back before rank 1 closes its socket
    if echo:
        moved = echo.bytes_moved(nbytes)
        echo.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"pushpull_times": pp, "allreduce_times": ar, "zmq_times": zq, "zmq_hot_times": zh,
                       "zmq_bytes": moved, "bytes": nbytes, "tensors": len(tensors), "workers": size,
                       "servers": cfg.num_server, "transport": "ipc" if ipc else "tcp", "memcpy_times": mc,
                       "shm_pushes": bps.engine().stats["shm_pushes"] if bps.engine() is not None else 0}, f)
    dist.destroy_process_group()
    bps.shutdown()
    return 0


# ---------------------------------------------------------------- driver --

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull bench allreduce", description=help_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="timed iterations of each method")
    p.add_argument("--json", action="store_true", help="last line: one JSON object with the results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.workers < 2:
        p.error("--workers must be >= 2 (all-reduce of one worker is a no-op)")
    r = run_job("pushpull bench allreduce", args.workers, args.servers,
                [sys.executable, "-m", "pushpull.bench.allreduce", "--child", "--repeat", str(args.repeat)],
                timeout=900)
    if r is None:
        return 1
    ceiling = {"rate_Bps": r["zmq_bytes"] / statistics.median(r["zmq_times"])}
    hot_rate = r["zmq_bytes"] / statistics.median(r["zmq_hot_times"])
    pp = statistics.median(r["pushpull_times"])
    ar = statistics.median(r["allreduce_times"])
    pp_rate = 2 * r["workers"] * r["bytes"] / pp
    memcpy_rate = r["bytes"] / statistics.median(r["memcpy_times"])
    cores = os.cpu_count() or 1
    memory_bound = 2 * r["workers"] * r["bytes"] / (memcpy_rate * cores)
    result = {
        "workers": r["workers"], "servers": r["servers"], "tensors": r["tensors"], "bytes": r["bytes"],
        "pushpull_s": pp, "allreduce_s": ar, "ratio_vs_allreduce": ar / pp,
        "pushpull_rate_GBps": pp_rate / 1e9, "zmq_ceiling_GBps": ceiling["rate_Bps"] / 1e9,
        "fraction_of_zmq_ceiling": pp_rate / ceiling["rate_Bps"],
        "zmq_hot_buffer_ceiling_GBps": hot_rate / 1e9, "fraction_of_hot_buffer_ceiling": pp_rate / hot_rate,
        "pushpull_times": r["pushpull_times"], "allreduce_times": r["allreduce_times"], "zmq_times": r["zmq_times"],
        "zmq_hot_times": r["zmq_hot_times"], "transport": r["transport"],
        "memcpy_GBps": memcpy_rate / 1e9, "cores": cores, "memory_bound_s": memory_bound,
        "fraction_of_memory_bound": memory_bound / pp, "shared_memory": r["shm_pushes"] > 0,
    }
    print(f"ResNet-50 gradients: {r['tensors']} tensors, {r['bytes'] / MiB:.1f} MiB, "
          f"{r['workers']} workers, {r['servers']} servers, median of {args.repeat}")
    print(f"  push_pull (pushpull)      {pp * 1e3:8.1f} ms")
    print(f"  all_reduce (gloo)         {ar * 1e3:8.1f} ms")
    print(f"  ratio gloo / pushpull     {ar / pp:8.2f}x")
    print(f"  memory bound              {memory_bound * 1e3:8.1f} ms (2 x workers x bytes copied at "
          f"{memcpy_rate / 1e9:.2f} GB/s memcpy x {cores} cores)")
    print(f"  fraction of memory bound  {memory_bound / pp:8.2f}")
    via = ("shared memory (PUSHPULL_LOCAL_SHM), headers over " + r["transport"] if r["shm_pushes"]
           else r["transport"])
    print(f"  pushpull payload rate     {pp_rate / 1e9:8.2f} GB/s (2 x workers x bytes / time; payloads via {via})")
    print(f"  raw pyzmq echo ceiling    {ceiling['rate_Bps'] / 1e9:8.2f} GB/s (ranks 0 and 1, same job, "
          f"the same bytes, over {r['transport']})")
    print(f"  fraction of ceiling       {pp_rate / ceiling['rate_Bps']:8.2f}")
    print(f"  (one cache-hot 4 MiB buffer bounced instead: {hot_rate / 1e9:.2f} GB/s, "
          f"fraction {pp_rate / hot_rate:.2f})")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
