"""Configuration dataclasses and unit parsing for the simulator.

Everything is in SI base units inside the simulator (bytes, bytes/s,
seconds); the parsers exist so that a command line or a benchmark row can say
``10gbit`` or ``50us`` and a typo is reported with the argument's name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pushpull import units
from pushpull.config import DEFAULTS, default_partition_bytes

BACKENDS = ("ps", "allreduce")
COMPUTE_CLOCKS = ("sequential", "deadline")

# ---------------------------------------------------------------------------
# unit parsing
# ---------------------------------------------------------------------------

def parse_bandwidth(value, arg: str = "bandwidth") -> float:
    """``10gbit``, ``100mbit``, ``25Gbps``, ``1.25GB/s`` -> bytes/s; ``inf`` = an infinitely fast network.
    Units: :mod:`pushpull.units` (a number from code is bytes/s; a string needs a unit)."""
    return units.rate_bytes(value, arg, allow_inf=True)


def parse_bytes(value, arg: str = "bytes") -> int:
    """``4MB``, ``4096000``, ``64MiB`` -> bytes (decimal k/M/G, binary KiB/MiB/GiB)."""
    return units.size_bytes(value, arg)


def parse_duration(value, arg: str = "latency") -> float:
    """``50us``, ``1ms``, ``0.2s`` -> seconds (a number from code is seconds; a string needs a unit)."""
    return units.duration_s(value, arg)


format_bandwidth = units.format_rate
format_bytes = units.format_size


# ---------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------

@dataclass
class CpuCosts:
    """CPU-seconds each process spends per byte it moves, and the cores it has: what bounds a fast link.

    Every byte a process sends or receives through a socket, sums or encrypts costs CPU (copies between
    user and kernel, the TCP stack, ZeroMQ's I/O threads, the cipher). At 100 Mbit/s-1 Gbit/s that is far
    below the link; at 10 Gbit/s, on a machine whose few cores the job's processes share, it is the
    bound. The simulator charges it as a second resource beside each NIC: a process is a *CPU link* of
    ``cores`` CPU-seconds per second, and every flow of bytes through the process uses it at the flow's
    rate times its CPU-seconds per byte (:class:`pushpull.sim.network.PSNetwork`). In the fluid PS
    network a CPU link is shared max-min fairly with the NICs, so a message goes at the slower of its wire
    share and its CPU share -- the fluid equivalent of ``max(wire time, CPU time)`` -- and a process's
    pushes and pulls share its one CPU, while its NIC is full-duplex. For the sequential ring a
    collective's time is ``2(n-1) latency + max(wire time, CPU time of one rank)``
    (:class:`pushpull.sim.network.Ring`).

    Per-byte costs (seconds per byte; 0: free):

    * ``worker_push`` per byte a PS worker pushes (send; encrypt where the job encrypts), ``worker_pull``
      per byte it pulls (receive; decrypt);
    * ``server_push`` per byte a server receives from one worker's push (receive, decrypt, sum into the
      key), ``server_pull`` per byte of one worker's pull answer it sends (send, encrypt);
    * ``ring_send``, ``ring_recv``, ``ring_sum``: a ring rank's primitives; one all-reduce of ``M`` bytes
      costs a rank ``2(n-1)/n M (ring_send + ring_recv) + (n-1)/n M ring_sum`` (reduce-scatter sums, the
      all-gather only copies).

    Cores: ``cores`` per process (default 1: a worker or a server runs one I/O thread that does the
    copying). ``shared_cores``: every process of the job (n workers and k servers, or n ring ranks) runs
    on one machine with this many cores between them -- the emulated cluster on a 2-core VM is
    ``shared_cores=2``; None (default): each process has its cores to itself.

    :meth:`from_probe` builds one from a ``pushpull bench probe`` row; a row without the CPU fields gives
    None, which charges nothing (old probe files keep their predictions).
    """
    worker_push: float = 0.0
    worker_pull: float = 0.0
    server_push: float = 0.0
    server_pull: float = 0.0
    ring_send: float = 0.0
    ring_recv: float = 0.0
    ring_sum: float = 0.0
    cores: float = 1.0
    shared_cores: float | None = None

    def __post_init__(self):
        for name in ("worker_push", "worker_pull", "server_push", "server_pull", "ring_send", "ring_recv",
                     "ring_sum"):
            v = getattr(self, name)
            if not (v >= 0) or math.isinf(v):
                raise ValueError(f"{name} must be a finite number >= 0 s/byte, got {v!r}")
        if not (self.cores > 0) or math.isinf(self.cores):
            raise ValueError(f"cores must be a finite number > 0, got {self.cores!r}")
        if self.shared_cores is not None and (not (self.shared_cores > 0) or math.isinf(self.shared_cores)):
            raise ValueError(f"shared_cores must be a finite number > 0 or None, got {self.shared_cores!r}")

    def ring_cpu_s(self, workers: int, payload: float) -> float:
        """CPU-seconds one ring rank spends on an all-reduce of ``payload`` bytes."""
        n = workers
        if n <= 1:
            return 0.0
        return (2 * (n - 1) / n * payload * (self.ring_send + self.ring_recv)
                + (n - 1) / n * payload * self.ring_sum)

    def rank_cores(self, processes: int) -> float:
        """Cores one of ``processes`` identical busy processes gets: its own, or its share of the pool."""
        if self.shared_cores is None:
            return self.cores
        return min(self.cores, self.shared_cores / max(1, processes))

    @classmethod
    def from_probe(cls, row: dict | None, encryption: str | None = "auto", cores: float = 1.0,
                   shared_cores: float | None = None, data_lane: bool = False) -> "CpuCosts | None":
        """Per-role costs from the primitives ``pushpull bench probe`` measured (``cpu_*`` fields, CPU
        seconds per byte; None where the row has none).

        PS: the data path is ZeroMQ (``cpu_zmq_send``/``cpu_zmq_recv``), or with ``data_lane`` (PUSHPULL_DATA_LANE=1)
        a lane, a plain socket (``cpu_tcp_send``/``cpu_tcp_recv``); a server also sums every push
        (``cpu_sum``). ``encryption``: ``"curve"`` adds ZeroMQ CURVE's extra cost per byte on both ends
        (``cpu_curve_send``/``cpu_curve_recv``), ``"aesgcm"`` AES-128-GCM's (``cpu_aesgcm_encrypt``/
        ``cpu_aesgcm_decrypt``), None or ``"none"`` nothing; ``"auto"`` is what PUSHPULL_AUTH=auto does
        between machines: AES-GCM on a lane, CURVE on ZeroMQ. The ring is gloo over plain TCP
        (``cpu_tcp_send``/``cpu_tcp_recv``), never encrypted."""
        if not row or "cpu_tcp_send" not in row:
            return None
        g = lambda k: float(row.get(k) or 0.0)   # noqa: E731
        enc = (encryption or "none").lower()
        if enc == "auto":
            enc = "aesgcm" if data_lane else "curve"
        if enc == "curve":
            e_send, e_recv = g("cpu_curve_send"), g("cpu_curve_recv")
        elif enc == "aesgcm":
            e_send, e_recv = g("cpu_aesgcm_encrypt"), g("cpu_aesgcm_decrypt")
        elif enc in ("none", "plain"):
            e_send = e_recv = 0.0
        else:
            raise ValueError(f"encryption must be auto, curve, aesgcm or none, got {encryption!r}")
        if data_lane:
            zs, zr = g("cpu_tcp_send"), g("cpu_tcp_recv")
        else:
            zs = g("cpu_zmq_send") or g("cpu_tcp_send")
            zr = g("cpu_zmq_recv") or g("cpu_tcp_recv")
        return cls(worker_push=zs + e_send, worker_pull=zr + e_recv,
                   server_push=zr + e_recv + g("cpu_sum"), server_pull=zs + e_send,
                   ring_send=g("cpu_tcp_send"), ring_recv=g("cpu_tcp_recv"), ring_sum=g("cpu_sum"),
                   cores=cores, shared_cores=shared_cores)


def read_probe(path) -> dict | None:
    """The latest row of a ``pushpull bench probe --out`` file that holds the CPU figures (``cpu_*``), or
    None where there is none (a file written before they existed: nothing is charged)."""
    import json
    from pathlib import Path

    best = None
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{i + 1}: not a JSON line ({e})") from None
        if isinstance(row, dict) and "cpu_tcp_send" in row:
            best = row
    return best


@dataclass
class ClusterConfig:
    """The machines and the network the simulated job runs on.

    ``workers`` are network endpoints (machines). Each may hold ``local_size``
    devices whose gradients are reduced locally (NVLink/PCIe, assumed free)
    before one copy crosses the network, as BytePS and NCCL's hierarchical
    rings do; throughput counts ``workers * local_size`` replicas. With
    ``local_reduce=False`` (PUSHPULL_LOCAL_REDUCE=0) each of a machine's
    processes pushes and pulls every tensor over the shared NIC, so every
    link carries ``local_size`` copies: the PS network is modelled with every
    NIC's rate divided by ``local_size`` (the fluid model's exact equivalent;
    per-message latency is not multiplied). PS backend only.
    """
    workers: int
    bandwidth: float                    # bytes/s per host NIC, each direction
    servers: int | None = None          # PS servers; None -> same as workers
    backend: str = "ps"                 # "ps" | "allreduce"
    latency: float = 50e-6              # per-message latency (alpha), seconds
    colocated: bool = False             # BytePS style: server k shares machine k's NIC
    server_bandwidth: float | None = None   # per server NIC; None -> bandwidth
    sum_rate: float | None = None       # server summation, input bytes/s; None -> free
    ps_partition_bytes: int | None = None   # PS key size (BYTEPS_PARTITION_BYTES); None -> the default at k servers
    local_size: int = 1                 # devices per worker machine
    message_s: float = 0.0              # per-message CPU time on a worker (FIFO, overlaps the wire)
    local_reduce: bool = True           # False: each device pushes everything over the machine's NIC
    dispatch_s: float | None = None     # all-reduce: rank 0's order message per batch; None -> order_message_s()
    cpu: CpuCosts | None = None         # CPU per byte of each role and the cores (None: bytes cost no CPU)

    def __post_init__(self):
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {self.workers!r}")
        if self.servers is None:
            self.servers = self.workers
        if not isinstance(self.servers, int) or self.servers < 1:
            raise ValueError(f"servers must be an integer >= 1, got {self.servers!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not (self.bandwidth > 0):
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if self.server_bandwidth is None:
            self.server_bandwidth = self.bandwidth
        if not (self.server_bandwidth > 0):
            raise ValueError(f"server_bandwidth must be > 0 bytes/s, got {self.server_bandwidth!r}")
        if not (self.latency >= 0) or math.isinf(self.latency):
            raise ValueError(f"latency must be a finite number >= 0 s, got {self.latency!r}")
        if self.sum_rate is not None and not (self.sum_rate > 0):
            raise ValueError(f"sum_rate must be > 0 bytes/s or None, got {self.sum_rate!r}")
        if self.ps_partition_bytes is None:
            self.ps_partition_bytes = default_partition_bytes(self.servers)
        if not isinstance(self.ps_partition_bytes, int) or self.ps_partition_bytes < 1:
            raise ValueError(f"ps_partition_bytes must be an integer >= 1, got {self.ps_partition_bytes!r}")
        if not isinstance(self.local_size, int) or self.local_size < 1:
            raise ValueError(f"local_size must be an integer >= 1, got {self.local_size!r}")
        if not self.local_reduce and self.backend != "ps" and self.local_size > 1:
            raise ValueError("local_reduce: local_reduce=False is modelled for the PS backend only")
        if not (self.message_s >= 0) or math.isinf(self.message_s):
            raise ValueError(f"message_s must be a finite number >= 0 s, got {self.message_s!r}")
        if self.dispatch_s is not None and (not (self.dispatch_s >= 0) or math.isinf(self.dispatch_s)):
            raise ValueError(f"dispatch_s must be a finite number >= 0 s or None, got {self.dispatch_s!r}")
        if self.cpu is not None and not isinstance(self.cpu, CpuCosts):
            raise ValueError(f"cpu must be a CpuCosts or None, got {type(self.cpu).__name__}")
        if self.colocated and self.servers > self.workers:
            raise ValueError(f"servers: colocated mode puts one server on each of the first "
                             f"{self.workers} worker machines; got servers={self.servers}")

    @property
    def replicas(self) -> int:
        return self.workers * self.local_size

    def order_message_s(self) -> float:
        """All-reduce backend: how long rank 0's dispatcher takes per batch, i.e. per order message (a small
        broadcast over the control group that every rank waits for before issuing the batch's
        collectives). ``dispatch_s`` where set; by default the latency the model charges one tiny
        collective (its 2(n-1) steps): the same gloo machinery over the same ranks."""
        if self.dispatch_s is not None:
            return self.dispatch_s
        return 2 * (self.workers - 1) * self.latency

    def alpha_beta(self) -> tuple[float, float]:
        """(alpha, beta) of an unloaded reduction, ``t(bytes) = alpha + beta*bytes``.

        MG-WFBP plans with this linear model. All-reduce: the ring's 2(n-1)
        steps. PS: push then pull of a message that is spread over the
        servers, each direction limited by the worker NIC or by the servers'
        aggregate share ``k*B_s/n``.
        """
        n, k, B = self.workers, self.servers, self.bandwidth
        if self.backend == "allreduce":
            if n == 1:
                return 0.0, 0.0
            beta = 2 * (n - 1) / (n * B)
            if self.cpu is not None:
                beta = max(beta, self.cpu.ring_cpu_s(n, 1.0) / self.cpu.rank_cores(n))
            return 2 * (n - 1) * self.latency, beta
        eff = min(B, k * self.server_bandwidth / n)
        c = self.cpu
        if c is not None:   # each direction also bounded by the worker's and the servers' CPU (and the pool)
            bounds = [(c.worker_push, c.cores), (c.worker_pull, c.cores),
                      (c.server_push * n, k * c.cores), (c.server_pull * n, k * c.cores)]
            if c.shared_cores is not None:
                bounds += [(n * (c.worker_push + c.server_push), c.shared_cores),
                           (n * (c.worker_pull + c.server_pull), c.shared_cores)]
            for per_byte, cap in bounds:
                if per_byte > 0:
                    eff = min(eff, cap / per_byte)
        return 2 * self.latency, 2.0 / eff


def per_call_costs(backend: str, workers: int, t_small: float, t_stream: float) -> tuple[float, float]:
    """(latency, message_s) of a ClusterConfig from two timings of tiny reductions: ``t_small``, one tiny
    reduction alone, and ``t_stream``, the time per reduction in a stream of small ones submitted at once.
    The ``auto`` strategy maps its start-up probes with this, and the validation the probe a user runs
    before a job (``pushpull bench probe``).

    PS: every reduction is its own push and pull, so the stream's time per reduction is the per-message
    CPU stage (what a worker gets through when the wire is idle) and what one reduction alone takes beyond
    it is latency, split over a push and a pull.

    All-reduce: the backend fuses a stream of small reductions into one or two collectives
    (:mod:`pushpull.policy.collective_fusion`), so the stream's time per reduction is no per-collective
    cost and is not used; one tiny reduction alone is rank 0's order message and then one collective,
    which the model prices alike (:meth:`ClusterConfig.order_message_s`), so half of ``t_small`` is one
    collective's fixed cost, spread over the ring's 2(n-1) latency terms, with no separate CPU stage."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    for name, v in (("t_small", t_small), ("t_stream", t_stream)):
        if not (v >= 0) or math.isinf(v):
            raise ValueError(f"{name} must be a finite number >= 0 s, got {v!r}")
    if backend == "allreduce":
        return max(1e-6, t_small / 2 / (2 * max(1, workers - 1))), 0.0
    msg = min(t_stream, t_small)
    return max(1e-6, (t_small - msg) / 2), msg


@dataclass
class Compression:
    """Gradient compression as the network sees it.

    ``ratio`` shrinks the payload of every tensor of at least
    ``min_compress_bytes`` (the runtime's default, BYTEPS_MIN_COMPRESS_BYTES); the codec costs are
    seconds per *uncompressed* byte, paid by the worker before a push and
    after a pull, and by the server (decompress n pushes, compress the sum).
    """
    ratio: float = 1.0
    compress_s_per_byte: float = 0.0
    decompress_s_per_byte: float = 0.0
    min_compress_bytes: int = DEFAULTS.min_compress_bytes
    # the pulls' ratio; None: the same as the pushes'. DiLoCo's outer keys answer with whole parameters
    # (pushpull/server/server.py), so their exchange is compressed one way only: 1.0
    answer_ratio: float | None = None

    def __post_init__(self):
        for name in ("ratio", "answer_ratio"):
            v = getattr(self, name)
            if name == "answer_ratio" and v is None:
                continue
            if not (v > 0) or math.isinf(v):
                raise ValueError(f"compression {name} must be a finite number > 0, got {v!r}")
        for name in ("compress_s_per_byte", "decompress_s_per_byte"):
            v = getattr(self, name)
            if not (v >= 0) or math.isinf(v):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.min_compress_bytes < 0:
            raise ValueError(f"min_compress_bytes must be >= 0, got {self.min_compress_bytes!r}")

    def applies(self, tensor_bytes: int) -> bool:
        return tensor_bytes >= self.min_compress_bytes

    @property
    def pull_ratio(self) -> float:
        return self.ratio if self.answer_ratio is None else self.answer_ratio


@dataclass
class SimOptions:
    """Knobs of the simulation itself (not of the cluster or the strategy)."""
    layerwise_update: bool = True   # next forward of layer l waits only for layer l's update
    iterations: int = 3             # iterations laid out in the trace; the last one is reported
    compute_scale: float = 1.0      # multiply profile compute times (GPU k x faster: 1/k)
    trace: bool = True              # keep per-event records for write_trace()
    compute_clock: str = "sequential"   # "deadline": forward layers end at fixed offsets (sleep replay)
    # the optimizer on the training thread (0: free, which keeps the closed forms exact)
    update_s: float = 0.0           # layer-wise: per tensor, applied in its layer's forward (before the layer)
    step_call_s: float = 0.0        # per iteration: the optimizer's step() call after the backward
    wake_s: float = 0.0             # per wait that blocks: completion on another thread -> training thread runs

    def __post_init__(self):
        if self.compute_clock not in COMPUTE_CLOCKS:
            raise ValueError(f"compute_clock must be one of {COMPUTE_CLOCKS}, got {self.compute_clock!r}")
        if self.iterations < 2:
            raise ValueError(f"iterations must be >= 2 (one warm-up, one steady), got {self.iterations!r}")
        if not (self.compute_scale >= 0) or math.isinf(self.compute_scale):
            raise ValueError(f"compute_scale must be a finite number >= 0, got {self.compute_scale!r}")
        for name in ("update_s", "step_call_s", "wake_s"):
            v = getattr(self, name)
            if not (v >= 0) or math.isinf(v):
                raise ValueError(f"{name} must be a finite number >= 0 s, got {v!r}")


__all__ = [
    "ClusterConfig", "Compression", "CpuCosts", "SimOptions", "BACKENDS", "per_call_costs", "read_probe",
    "parse_bandwidth", "parse_bytes", "parse_duration", "format_bandwidth", "format_bytes",
]
