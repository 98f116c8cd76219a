"""Every setting of pushpull, parsed and validated in one place.

Each setting has a ``PUSHPULL_*`` environment variable and, where BytePS or
ps-lite had one, the BytePS name as an alias, so BytePS launch scripts keep
working. A bad value fails at start-up with a message naming the variable and
what it accepts, instead of a hang or a late crash.

``docs/configuration.md`` is generated from :data:`SETTINGS` (``pushpull config
--markdown``) and a test keeps the two in sync.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pushpull.policy import fusion as _fusion
from pushpull.policy.bytescheduler import DEFAULTS as _BS


class ConfigError(ValueError):
    """A setting has a value it cannot accept; the message names the variable."""


# ---------------------------------------------------------------- parsers ---

def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 0/1, true/false, yes/no or on/off")


def _lane_choice(s: str) -> str:
    v = s.strip().lower()
    if v == "auto":
        return v
    return "1" if _bool(v) else "0"


# PUSHPULL_DATA_LANE=auto carries a job's pushes and pulls over lanes when its keys are at least this large
LANE_MIN_PARTITION_BYTES = 1 << 20


def data_lane_wanted(mode: str, partition_bytes: int) -> bool:
    """PUSHPULL_DATA_LANE's ``mode`` (auto | 0 | 1) for keys of ``partition_bytes``: lanes or not."""
    if mode != "auto":
        return mode == "1"
    return int(partition_bytes) >= LANE_MIN_PARTITION_BYTES


def data_lane_on(cfg) -> bool:
    """Whether a worker carries its pushes and pulls over lanes (PUSHPULL_DATA_LANE, PUSHPULL_DIRECT_LANE)."""
    return bool(cfg.direct_lane) and data_lane_wanted(cfg.data_lane, cfg.partition_bytes)


def _int_min(lo: int) -> Callable[[str], int]:
    def parse(s: str) -> int:
        v = int(s.strip(), 0)
        if v < lo:
            raise ValueError(f"expected an integer >= {lo}")
        return v
    parse.__doc__ = f"integer >= {lo}"
    return parse


def _float_pos(s: str) -> float:
    v = float(s)
    if not v > 0:
        raise ValueError("expected a number > 0")
    return v


def _float_nonneg(s: str) -> float:
    v = float(s)
    if not v >= 0 or v == float("inf"):
        raise ValueError("expected a number >= 0")
    return v


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(s: str) -> str:
        v = s.strip().lower()
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return v
    parse.__doc__ = " | ".join(choices)
    return parse


def _on_off_auto(s: str) -> str:
    v = s.strip().lower()
    if v in ("", "auto"):
        return "auto"
    return "on" if _bool(v) else "off"


def _str(s: str) -> str:
    return s


def _opt_int(s: str) -> int | None:
    return None if s.strip() == "" else _int_min(0)(s)


def _auto_or_pos_float(s: str) -> float | None:
    if s.strip().lower() in ("", "auto"):
        return None
    return _float_pos(s)


def _auto_or_int(s: str) -> int | None:
    """'auto' (or empty) = None, chosen at start-up; otherwise an integer >= 0."""
    if s.strip().lower() in ("", "auto"):
        return None
    return _int_min(0)(s)


def _opt_float(s: str) -> float | None:
    """Empty = unset (measure / pick a default); otherwise a number >= 0."""
    if s.strip() == "":
        return None
    v = float(s)
    if not v >= 0:
        raise ValueError("expected a number >= 0 (or empty for automatic)")
    return v


def _opt_bytes(s: str) -> int | None:
    return None if s.strip() == "" else _int_min(1)(s)


def _runtime_strategies() -> list[str]:
    """The strategies PUSHPULL_STRATEGY accepts: every policy the runtime carries out (pushpull.policy)."""
    from pushpull import policy

    return [p.name for p in policy.all_policies() if p.runtime != "-"]


def _strategy(s: str) -> str:
    v = s.strip().lower()
    known = _runtime_strategies()  # read at parse time: a policy file added later is accepted
    if v not in known:
        raise ValueError(f"expected one of {', '.join(known)}")
    return v


_LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "fatal")


# ---------------------------------------------------------------- table ------

@dataclass(frozen=True)
class Setting:
    name: str                   # attribute name on Config
    env: str                    # canonical PUSHPULL_* variable
    aliases: tuple[str, ...]    # BytePS / ps-lite names accepted too
    default: Any
    parse: Callable[[str], Any]
    accepts: str                # human description of accepted values
    doc: str


def S(name, aliases, default, parse, accepts, doc) -> Setting:
    return Setting(name, "PUSHPULL_" + name.upper(), tuple(aliases), default, parse, accepts, doc)


SETTINGS: tuple[Setting, ...] = (
    # --- cluster / roles
    S("role", ["DMLC_ROLE"], "worker", _choice("worker", "server", "scheduler"),
      "worker | server | scheduler", "Role of this process when started by the launcher from the environment."),
    S("root_uri", ["DMLC_PS_ROOT_URI"], "127.0.0.1", _str, "host name or IP",
      "Address of the scheduler."),
    S("root_port", ["DMLC_PS_ROOT_PORT"], 9000, _int_min(1), "port 1..65535",
      "Port the scheduler listens on."),
    S("num_worker", ["DMLC_NUM_WORKER"], 1, _int_min(1), "integer >= 1",
      "Number of worker machines (each runs local_size worker processes)."),
    S("num_server", ["DMLC_NUM_SERVER"], 1, _int_min(0), "integer >= 0",
      "Number of server processes."),
    S("worker_id", ["DMLC_WORKER_ID"], None, _opt_int, "integer >= 0",
      "Index of this worker machine; rank = local_rank + worker_id * local_size. "
      "If unset, taken from torchrun (RANK), SLURM (SLURM_PROCID) or Open MPI (OMPI_COMM_WORLD_RANK)."),
    S("node_host", ["DMLC_NODE_HOST"], None, lambda s: s or None, "host name or IP",
      "Address other nodes use to reach this node (servers advertise it and listen on it)."),
    S("interface", ["DMLC_INTERFACE"], None, lambda s: s or None, "network interface name",
      "Interface whose IPv4 address is advertised (and listened on) when node_host is unset."),
    S("bind_host", [], None, lambda s: s or None, "host name or IP, or * for every interface",
      "Where the scheduler and servers listen; default: the address they advertise (DMLC_PS_ROOT_URI for the "
      "scheduler, node_host / interface for a server), never every interface unless asked."),
    S("local_rank", ["BYTEPS_LOCAL_RANK"], None, _opt_int, "integer >= 0",
      "Rank of this worker process on its machine (set by the launcher)."),
    S("local_size", ["BYTEPS_LOCAL_SIZE"], None, _opt_int, "integer >= 1",
      "Worker processes per machine (set by the launcher)."),
    S("local_reduce", [], "auto", _on_off_auto, "auto | 1 | 0",
      "Hierarchical local reduce when a machine runs several worker processes (BYTEPS_LOCAL_SIZE > 1): they sum "
      "through shared memory first, then each pushes and pulls 1/local_size of every tensor, so the machine's "
      "link carries each gradient once instead of local_size times (docs/hierarchical.md). auto: on when the "
      "servers are reached over a network (not all on 127.0.0.1, where no link is saved); 1: whenever "
      "local_size > 1; 0: off. Sums over every rank only (min/max, allgather and the like stay flat); CPU "
      "shared memory, no NCCL path. It applies only when every worker resolves it on, elastic training is "
      "off, and each machine's ranks share a host name; otherwise the job logs why and stays flat."),
    S("force_distributed", ["BYTEPS_FORCE_DISTRIBUTED"], False, _bool, "0 | 1",
      "Use the servers even with a single worker process (otherwise size()==1 reduces locally)."),
    S("shutdown", [], "leave", _choice("leave", "keep"), "leave | keep",
      "What shutdown() does with this worker's place in the job: 'leave' = leave it, as BytePS's shutdown "
      "does: it returns once every worker has finished (at most PUSHPULL_TIMEOUT), and then the servers and "
      "the scheduler exit; init() afterwards joins "
      "whatever job the environment names then, as BytePS's own tests do); 'keep' = keep it until the process "
      "exits, so that init() takes the same membership up again (Horovod's re-init). `pushpull launch "
      "--workers N` and the torchrun integration set 'keep' for their workers, who own no scheduler."),
    S("servers_per_node", [], 1, _int_min(0), "integer >= 0",
      "Under torchrun, srun or mpirun with no DMLC_* roles set: servers the local rank 0 of every node starts (the job has "
      "nodes x this many). 0 starts none, for servers placed by other means."),
    # --- worker data path
    S("partition_bytes", ["BYTEPS_PARTITION_BYTES"], 4096000, _int_min(1024), "integer >= 1024",
      "Tensors larger than this are split into partitions (keys) of at most this many bytes. Default: BytePS's "
      "4096000 with up to 4 servers; with k > 4 servers, 16384000 / k (at least 65536), because the first and "
      "the last key of a step each cost k x key / B on every link that no overlap hides (a fill and a drain), "
      "and the step's traffic per link does not grow with k: the keys shrink so that the fill and drain stay "
      "as short as at k = 4 (n = k = 8, 100 Mbit/s, 16 cores: BSP 1.44x the ring with the former default, 1.58x "
      "with this one; docs/results/byteps_ps_vs_allreduce_n8_16cores.md); and, where the servers are on other "
      "hosts, a DistributedOptimizer or ScheduledOptimizer shrinks it to the model's gradient bytes / (16 x k) "
      "when that is smaller, at least 1 MiB, for the same fill and drain (64 MB over k = 2 at 1 Gbit/s: 2 MB "
      "keys 652 ms a step, 4 MB keys 691-699 ms; docs/results/line_rate.md). Set by hand, it is checked once after "
      "the first step: with fewer than 8 keys per server (the step's gradient bytes / (servers x largest key)) "
      "where the default would give more, the worker logs a warning with both counts, because the fill and "
      "the drain, each about servers x key / B, are then about 2 / (keys per server) of the step's transfer "
      "(100 Mbit/s grid: 4 keys per server ran at 0.94x the ring, the default key at 1.38x; "
      "pushpull/worker/keycheck.py). A value larger than a message can carry (half of "
      "PUSHPULL_MAX_MESSAGE_BYTES, less 64 KiB) is capped there with one warning, as BytePS reads it as a "
      "maximum (its tests set 2147483647 for 'do not partition'); only workers read it."),
    S("scheduling_credit", ["BYTEPS_SCHEDULING_CREDIT"], None, _auto_or_int, "auto | integer >= 0 (0 = unlimited)",
      "Credit in partitions: how many partitions a worker may have pushed and not yet acknowledged (0 = no "
      "limit). auto (default; BytePS's default is 0): when the servers are on other hosts, a window of twice the "
      "measured bandwidth-delay product (the smallest round trip of a push, times the delivery rate of the "
      "pushes' acknowledgements over two windows of them, as acknowledgements come in bunches), at least "
      "one partition per server and 2, at most 64: every server's link has work while all workers push the same "
      "keys at the same time, so rounds complete in order instead of when the slowest of many competing "
      "TCP flows delivers (docs/results/byteps_ps_vs_allreduce.md); unlimited when every server is on this host "
      "(CPU-bound). The auto window keeps each worker's pushes in the order they became ready, the same on "
      "every worker; a credit set here, a scheduling strategy's (bytescheduler) and layer-wise updates "
      "(ScheduledOptimizer) order them by priority, the layers nearest the input first, as BytePS does when "
      "scheduling is on (a priority order under a pacing window diverged between workers: at 1 Gbit/s rounds "
      "waited up to 190 ms for the worker that sent a key last; docs/results/line_rate.md)."),
    S("min_compress_bytes", ["BYTEPS_MIN_COMPRESS_BYTES"], 65536, _int_min(0), "integer >= 0",
      "Tensors smaller than this are sent uncompressed."),
    S("keep_freed_buffers", [], True, _bool, "0 | 1",
      "Workers and servers keep freed message buffers (up to 32 MiB each, 1 GiB in all) in the process heap "
      "(glibc mallopt) instead of returning them to the kernel, which saves the page faults and zeroing every "
      "received message otherwise pays; 0 leaves the C library's defaults."),
    S("batch_bytes", [], 16384, _int_min(0), "integer >= 0 (0 = off)",
      "Messages with a body up to this size that are ready for the same peer in one pass of the I/O loop go "
      "as one BATCH message (a step's many tiny gradients then cost one zmq message, not one each). Kept "
      "below the partition size: batched partitions travel as one large message and no longer pipeline."),
    S("direct_bytes", [], 65536, _int_min(0), "integer >= 0 (0 = off)",
      "A blocking push_pull (not _async) of a ready, uncompressed, one-partition CPU tensor up to this size "
      "is sent and answered on the caller's own thread, skipping the communication thread's two hand-offs "
      "(what each path costs: `pushpull bench latency`, docs/results.md, Transport)."),
    S("direct_lane", [], True, _bool, "0 | 1",
      "Servers also listen for lanes: plain sockets (TCP, or an abstract Unix socket on loopback) whose peers "
      "prove with an HMAC that they hold the job secret, encrypted with AES-128-GCM where ZeroMQ would use "
      "CURVE (docs/security.md). On them the direct path (PUSHPULL_DIRECT_BYTES) sends and receives from the "
      "caller's thread without libzmq's I/O threads (docs/results.md, Transport), and workers carry their "
      "pushes and pulls (PUSHPULL_DATA_LANE). 0: no lanes; everything over ZeroMQ."),
    S("data_lane", [], "auto", _lane_choice, "auto | 0 | 1",
      "1: a worker's pushes and pulls to a server it reaches over TCP go through a lane (PUSHPULL_DIRECT_LANE) "
      "from its communication thread: large messages are read straight into their own buffers, and between "
      "machines each frame is encrypted once with AES-128-GCM instead of CURVE's copies: 0.6x CURVE's CPU per "
      "byte, 5-15 % less CPU per byte unencrypted (docs/results/line_rate.md). auto (default): lanes when the "
      f"job's keys (PUSHPULL_PARTITION_BYTES) are at least {LANE_MIN_PARTITION_BYTES} bytes, as by default: a lane "
      "handles each message in Python where libzmq uses a C thread of its own, which costs more than it saves "
      "on a CPU-bound host with small keys (the emulated 200 Mbit/s grid's 64 KiB keys, 2 cores: the PS at "
      "0.82x the ring over lanes, 1.12-1.27x over ZeroMQ). 0: always over the ZeroMQ connection."),
    S("local_ipc", [], True, _bool, "0 | 1",
      "A server reached on loopback also listens on an abstract Unix socket (ZeroMQ ipc, scoped to the network "
      "namespace as loopback is, with the same authentication), and the workers of its host send their pushes "
      "and pulls there: no TCP stack per byte (`pushpull bench allreduce`, docs/results.md, Transport). 0: "
      "loopback TCP."),
    S("local_shm", [], True, _bool, "0 | 1",
      "Workers on a loopback server's host exchange the payloads of keys over 64 KiB through shared memory "
      "(/dev/shm, one region per key, mode 0600, reserved up front, unlinked once each worker has pushed "
      "through it): a worker copies its partition once into its slot, the server sums from the slots into the region, and the workers "
      "read the sum from there, while the socket (PUSHPULL_LOCAL_IPC) carries only headers. Plain sums, minima, "
      "maxima and products of uncompressed tensors, without elastic training, backup workers or the local "
      "reduce, and not with PUSHPULL_AUTH=curve (payloads in memory files are not encrypted); the rest, and a "
      "/dev/shm without room, stay on the socket (docs/security.md, Shared memory). "
      "0: every payload on the socket."),
    S("threadpool_size", ["BYTEPS_THREADPOOL_SIZE"], 0, _int_min(0), "integer >= 0",
      "Threads that compress pushes and decompress pulls on the worker, in parallel and off the "
      "communication thread (0 = on the communication thread); for compressed models with many large "
      "partitions on a machine with cores to spare."),
    S("key_hash_fn", ["BYTEPS_KEY_HASH_FN"], "balanced", _choice("balanced", "djb2", "sdbm", "naive", "built_in"),
      "balanced | djb2 | sdbm | naive | built_in",
      "How partitions are mapped to servers: 'balanced' assigns by bytes (least loaded first); the others hash the key as BytePS does."),
    S("strategy", [], "wfbp", _strategy, " | ".join(_runtime_strategies()),
      "Communication strategy used by DistributedOptimizer. auto: measure the links and the model in the first "
      "steps, let the simulator pick backend, strategy, partition and credit, then measure the pick and the "
      "best on the other backend for a few steps each and keep the faster (docs/scheduling.md)."),
    S("backend", [], "ps", _choice("ps", "allreduce"), "ps | allreduce",
      "Reduce gradients through the parameter servers or through torch.distributed all-reduce."),
    S("fusion_threshold_bytes", [], _fusion.THRESHOLD_BYTES, _int_min(1), "integer >= 1",
      "Tensor-fusion buffer size for the 'fusion' strategy."),
    S("fusion_cycle_ms", [], _fusion.CYCLE_MS, _float_pos, "number > 0", "Tensor-fusion cycle time in milliseconds."),
    S("host_probe", [], None, lambda s: s or None, "file path, or empty",
      "A `pushpull bench probe --out` file of this machine: the 'auto' strategy charges its CPU cost per byte "
      "(socket, ZeroMQ, CURVE where PUSHPULL_AUTH encrypts, sums) to every worker, server and ring rank when it "
      "simulates the candidates, so on a fast link it sees where the processes' CPU, not the link, is the bound "
      "(docs/simulator.md, CPU per byte). Empty: bytes cost no CPU in its predictions."),
    S("shared_cores", [], None, _opt_float, "number > 0, or empty",
      "With host_probe: every process of the job (workers, servers) runs on one machine with this many cores "
      "between them (an emulated cluster on one machine); empty: each process has one core of its own."),
    S("strategy_warmup_steps", [], 2, _int_min(1), "integer >= 1",
      "Steps the 'fusion' and 'mgwfbp' strategies measure gradient-ready times (reducing as one buffer) "
      "before fixing their buffers from rank 0's measurement."),
    S("mgwfbp_alpha", [], None, _opt_float, "seconds >= 0, or empty = measure",
      "MG-WFBP: start-up cost of one reduction (alpha of alpha + beta*bytes); empty = fitted from a few "
      "reductions of different sizes at the end of the warm-up."),
    S("mgwfbp_beta", [], None, _opt_float, "seconds per byte >= 0, or empty = measure",
      "MG-WFBP: per-byte cost of one reduction (beta); empty = fitted with alpha."),
    S("bytescheduler_partition_bytes", [], None, _opt_bytes, "integer >= 1, or empty = default",
      f"ByteScheduler partition size; default {_BS['ps'][0]} (1 M float32 elements) over ps, "
      f"{_BS['allreduce'][0]} over allreduce."),
    S("bytescheduler_credit_bytes", [], None, _opt_bytes, "integer >= 1, or empty = default",
      f"ByteScheduler credit (bytes in flight); default {_BS['ps'][1]} (4 M elements) over ps, "
      f"{_BS['allreduce'][1]} over allreduce."),
    S("allreduce_port", [], None, _opt_int, "port 1..65535, or empty = DMLC_PS_ROOT_PORT + 2",
      "Port of rank 0's torch.distributed rendezvous store for PUSHPULL_BACKEND=allreduce (rank 0 runs on "
      "DMLC_PS_ROOT_URI)."),
    # --- server
    S("server_engine_thread", ["BYTEPS_SERVER_ENGINE_THREAD"], 4, _int_min(0), "integer >= 0",
      "Summation threads per server; 0 = sum on the thread that receives (no hand-off between threads). "
      "`pushpull launch` picks it from the cores unless set: cores / (workers + servers), between 1 and 4."),
    S("server_enable_schedule", ["BYTEPS_SERVER_ENABLE_SCHEDULE"], False, _bool, "0 | 1",
      "As in BytePS, a server's engine threads serve what is queued for them keys with fewer pushes received "
      "first (a key lagging behind the others is summed and answered before keys that are ahead; each key's "
      "requests keep their order). Keys up to 64 KiB are summed on arrival and never queued. Off by default: "
      "each worker's credit window keeps only about a bandwidth-delay product in flight, so a queue holds "
      "little to reorder (docs/results/byteps_ps_vs_allreduce.md)."),
    S("enable_async", ["BYTEPS_ENABLE_ASYNC"], False, _bool, "0 | 1",
      "Asynchronous training: pushpull.torch.DistributedOptimizer trains as asynchronous=True (each worker steps "
      "on its own gradients and pushes the change to the servers' copy of the parameters, which a pull returns at "
      "once; docs/async.md). Only the parameters become parameter stores on the servers: other reductions in the "
      "job (metrics, broadcasts) still sum, unlike BytePS's server-wide switch."),
    S("backup_workers", ["PUSHPULL_BACKUP_WORKERS"], 0, _int_min(0), "integer >= 0",
      "Backup workers (Chen et al. 2016): a round of DistributedOptimizer's gradients completes with the first "
      "n - b pushes of each key; later pushes for a completed round are dropped (counted per rank: the servers "
      "log them at shutdown) and the average divides by the pushes summed. 0: off (docs/async.md)."),
    S("backup_rounds", ["PUSHPULL_BACKUP_ROUNDS"], 8, _int_min(2), "integer >= 2",
      "Rounds a server keeps per backup-workers key: how far the fast workers may run ahead of the slowest "
      "before a push of theirs waits for it to pull (each kept round costs one copy of the key on the server)."),
    # --- security (docs/security.md)
    S("auth", [], "auto", _choice("auto", "curve", "plain", "none"), "auto | curve | plain | none",
      "How nodes prove they belong to the job (credentials derived from the job secret; a peer without them "
      "gets no reply): 'curve' = ZeroMQ CURVE, authenticated and encrypted; 'plain' = ZeroMQ PLAIN, "
      "authenticated, not encrypted (an eavesdropper could read and replay); 'auto' = CURVE between machines, "
      "PLAIN on loopback, which no other machine reaches or sees; 'none' = anyone who reaches a port is a "
      "member (logs a warning). docs/security.md."),
    S("secret", [], None, lambda s: s or None, "any string (keep it private)",
      "The job secret, the same on every machine. `pushpull launch --workers N` makes a fresh one for its "
      "job; multi-machine jobs set it (or secret_file) themselves. A job whose every address is loopback and "
      "that names none (BytePS's own scripts) uses this user's local secret, ~/.pushpull/local_secret (mode "
      "0600, made on first use; PUSHPULL_LOCAL_SECRET_DIR moves it). Never printed."),
    S("max_message_bytes", [], 64 << 20, _int_min(1 << 20), "integer >= 1048576",
      "Largest message a server accepts (4 MiB for the scheduler); a peer that sends a larger one is "
      "disconnected before it is buffered. Partitions must fit in half of it (compressed payloads of odd "
      "ratios can outgrow their partition)."),
    S("server_max_keys", [], 100_000, _int_min(1), "integer >= 1",
      "Keys (partitions) one server holds, declared or being declared; an INIT beyond it is refused, so a "
      "flood of declarations cannot grow a server without bound."),
    S("sparse_max_table_bytes", [], 4 << 30, _int_min(0), "integer >= 0",
      "Bytes of sparse-table rows (and their Adagrad state) one server holds, all tables together; a "
      "SparseEmbedding whose row range on a server would pass it is refused at its declaration, naming the "
      "table and the bytes (docs/sparse.md)."),
    S("allow_pickle", [], False, _bool, "0 | 1",
      "broadcast_object may unpickle what the root sent (runs code chosen by whoever sent it); off, objects "
      "load as JSON or with torch.load(weights_only=True): tensors, containers, numbers, strings."),
    S("secret_file", [], None, lambda s: s or None, "file path",
      "A file holding the job secret (its first line), instead of secret."),
    # --- elastic training (docs/elastic.md)
    S("min_workers", [], 0, _int_min(0), "integer >= 0 (0 = off)",
      "Elastic training: when a worker dies and at least this many remain, the job goes on with them (ranks "
      "renumbered, averages over the survivors; in-flight operations raise WorkersChanged, which "
      "pushpull.torch.elastic.run turns into a restore of the last commit) instead of ending. "
      "`pushpull launch --min-workers M` sets it."),
    S("sparse_copy_steps", [], 1000, _int_min(0), "integer >= 0",
      "The most steps an elastic job's commit takes to copy its sparse tables' changed rows to the workers. The "
      "copy is read a share per step while the step's push goes up, at the pace of half the bytes the slowest "
      "worker pushes per step, and the commit becomes the one a change goes back to once it is complete (until "
      "then, the one before); a commit that comes sooner reads the rest of the one before. 0: a commit reads "
      "every changed row before it returns (docs/sparse.md)."),
    S("elastic_dir", [], None, lambda s: s or None, "folder path, or 'off'",
      "Where pushpull.torch.elastic.run keeps each commit on this node's disk (one file, replaced at each commit, "
      "written by the node's local rank 0), so that a restart of every worker resumes from the last commit: "
      "torchrun --nnodes MIN:MAX restarts every worker when a node leaves or joins. After such a restart the ranks "
      "agree on the newest commit any node kept and every rank takes it from that node. Default: under torchrun "
      "with --max-restarts > 0 and an --rdzv-id (not 'none'), a private folder of this user's in the temp "
      "folder, one per run id, whose commits only the torchrun agent that wrote them resumes; otherwise off. "
      "Values must load with torch.load(weights_only=True): tensors, numbers, strings, containers (docs/elastic.md)."),
    S("scheduler_recovery", [], 0.0, _float_nonneg, "seconds >= 0 (0 = off)",
      "A lost scheduler: nodes keep training and wait this long for a new one at the same address, then "
      "register with it again (it rebuilds the membership from them); 0: a lost scheduler ends the job. "
      "`pushpull launch --restart-scheduler` sets 30 and starts the new scheduler (docs/elastic.md)."),
    S("scheduler_recover", [], False, _bool, "0 | 1",
      "This scheduler replaces a lost one: it takes the job's membership from the nodes that register again "
      "instead of starting a job (the launcher sets it on the scheduler it restarts)."),
    # --- liveness
    S("timeout", [], 120.0, _float_pos, "seconds > 0",
      "Longest wait for any reply (registration, barrier, a push_pull) before an error names what is missing."),
    S("register_timeout", [], 15.0, _float_pos, "seconds > 0",
      "Longest wait for every node to register (and for a node to hear from the scheduler) before an error "
      "names who is missing; progress is reported every 5 s meanwhile. Raise it when machines start far apart."),
    S("heartbeat_interval", [], 1.0, _float_pos, "seconds > 0", "How often nodes tell the scheduler they are alive."),
    S("heartbeat_timeout", [], 15.0, _float_pos, "seconds > 0",
      "A node silent this long is declared dead and every node is told."),
    # --- observability
    S("log_level", ["BYTEPS_LOG_LEVEL"], "warning", _choice(*_LOG_LEVELS),
      " | ".join(_LOG_LEVELS), "Logging level."),
    S("trace_on", ["BYTEPS_TRACE_ON"], False, _bool, "0 | 1", "Write a Chrome-trace timeline per worker."),
    S("trace_start_step", ["BYTEPS_TRACE_START_STEP"], 10, _int_min(0), "integer >= 0", "First traced step."),
    S("trace_end_step", ["BYTEPS_TRACE_END_STEP"], 20, _int_min(0), "integer >= 0", "Last traced step."),
    S("trace_dir", ["BYTEPS_TRACE_DIR"], "./trace", _str, "directory", "Where timelines are written."),
    S("metrics_port", [], 0, _int_min(0), "integer >= 0 (0 = off)",
      "A Prometheus endpoint (http://HOST:PORT/metrics; needs the [metrics] extra, prometheus_client) on every "
      "worker and server: worker rank r (the rank it registered with) listens on this port + r, server k on "
      "this port + 500 + k. Step time, bytes pushed and pulled, operations in flight, the job's size and "
      "generation; a server's keys, rounds, queue depth and late pushes (docs/metrics.md)."),
    S("tensorboard_dir", [], None, lambda s: s or None, "directory",
      "TensorBoard scalars from every worker into DIR/worker<first rank> (needs the tensorboard package, in the "
      "[metrics] extra): per optimizer step its wall time and the megabytes per second pushed and pulled, the "
      "job's size and generation (docs/metrics.md)."),
    S("metrics_host", [], "127.0.0.1", _str, "host name or IP, or 0.0.0.0",
      "Where the Prometheus endpoints listen: loopback by default (the endpoints have no authentication; the "
      "figures hold no tensor and no secret, but the job's size, ranks and rates); the node's own address, or "
      "0.0.0.0, for a Prometheus server on another machine (a warning says so)."),
    # --- auto-tuning (pushpull.torch.autotune)
    S("autotune", [], False, _bool, "0 | 1",
      "Tune partition size and credit online by Bayesian optimisation; rank 0 decides, every worker applies "
      "the same setting at the same step (docs/autotune.md)."),
    S("autotune_startup_trials", [], 10, _int_min(0), "integer >= 0",
      "Auto-tuning: random points measured before the model-guided ones."),
    S("autotune_trials", [], 15, _int_min(0), "integer >= 0",
      "Auto-tuning: model-guided trials after the random ones."),
    S("autotune_window", [], 10, _int_min(1), "integer >= 1",
      "Auto-tuning: steps measured per trial (the objective is their mean step time)."),
    S("autotune_warmup", [], 3, _int_min(0), "integer >= 0",
      "Auto-tuning: steps dropped after each change before measuring (new keys, caches)."),
    S("autotune_sampler", [], "gp", _choice("gp", "tpe"), "gp | tpe",
      "Auto-tuning: optuna sampler, Gaussian process (expected improvement) or TPE."),
    S("autotune_scale", [], None, _auto_or_pos_float, "auto | number > 0",
      "Auto-tuning: factor on the search space (credit 1..16 M and partition 2..32 M elements); "
      "auto = min(1, model elements / 32 M), so small models get a space that fits them."),
    S("autotune_seed", [], 0, _int_min(0), "integer >= 0", "Auto-tuning: seed of the sampler."),
    S("autotune_log", [], None, lambda s: s or None, "file path",
      "Auto-tuning: JSON-lines log of trials and applied settings; {rank} is replaced by the rank "
      "(default <trace_dir>/<rank>/autotune.jsonl)."),
)

_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Config:
    """Resolved settings, one typed attribute per row of :data:`SETTINGS` (same names, same order);
    build with :func:`load_config` (or :meth:`defaults`), change with :meth:`replace`.

    The attributes are written out, not generated, so that a type checker and an editor know them; a
    check at import (and ``tests/unit/test_config.py``) keeps them and the table the same list, and
    a misspelt attribute is an ``AttributeError`` at once. ``sources`` says where each value came from
    (the variable that set it, or ``"default"``).
    """

    # --- cluster / roles
    role: str
    root_uri: str
    root_port: int
    num_worker: int
    num_server: int
    worker_id: int | None
    node_host: str | None
    interface: str | None
    bind_host: str | None
    local_rank: int | None
    local_size: int | None
    local_reduce: str
    force_distributed: bool
    shutdown: str
    servers_per_node: int
    # --- worker data path
    partition_bytes: int
    scheduling_credit: int | None
    min_compress_bytes: int
    keep_freed_buffers: bool
    batch_bytes: int
    direct_bytes: int
    direct_lane: bool
    data_lane: str  # auto | 0 | 1: pushpull.config.data_lane_on decides
    local_ipc: bool
    local_shm: bool
    threadpool_size: int
    key_hash_fn: str
    strategy: str
    backend: str
    fusion_threshold_bytes: int
    fusion_cycle_ms: float
    host_probe: str | None
    shared_cores: float | None
    strategy_warmup_steps: int
    mgwfbp_alpha: float | None
    mgwfbp_beta: float | None
    bytescheduler_partition_bytes: int | None
    bytescheduler_credit_bytes: int | None
    allreduce_port: int | None
    # --- server
    server_engine_thread: int
    server_enable_schedule: bool
    enable_async: bool
    backup_workers: int
    backup_rounds: int
    # --- security
    auth: str
    secret: str | None = field(repr=False)  # never printed
    max_message_bytes: int
    server_max_keys: int
    sparse_max_table_bytes: int
    allow_pickle: bool
    secret_file: str | None
    # --- elastic training
    min_workers: int
    sparse_copy_steps: int
    elastic_dir: str | None
    scheduler_recovery: float
    scheduler_recover: bool
    # --- liveness
    timeout: float
    register_timeout: float
    heartbeat_interval: float
    heartbeat_timeout: float
    # --- observability
    log_level: str
    trace_on: bool
    trace_start_step: int
    trace_end_step: int
    trace_dir: str
    metrics_port: int
    tensorboard_dir: str | None
    metrics_host: str
    # --- auto-tuning
    autotune: bool
    autotune_startup_trials: int
    autotune_trials: int
    autotune_window: int
    autotune_warmup: int
    autotune_sampler: str
    autotune_scale: float | None
    autotune_seed: int
    autotune_log: str | None

    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def defaults(cls) -> "Config":
        """Every setting at its documented default, whatever the environment says: the values the
        simulator and the benchmarks assume when they model or launch an out-of-the-box job."""
        return cls(**{s.name: s.default for s in SETTINGS}, sources={s.name: "default" for s in SETTINGS})

    @property
    def values(self) -> dict[str, Any]:
        """name -> value of every setting, in the table's order."""
        return {s.name: getattr(self, s.name) for s in SETTINGS}

    def replace(self, **kw: Any) -> "Config":
        """A copy with some settings changed (not re-validated, as a caller that sets one knows it)."""
        unknown = set(kw) - set(_BY_NAME)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **kw, sources=dict(self.sources))


def _check_fields() -> None:
    """Config's attributes are the table's names in the table's order: a setting added to one and not
    the other fails at import, naming it."""
    attrs = [f.name for f in dataclasses.fields(Config) if f.name != "sources"]
    names = [s.name for s in SETTINGS]
    if attrs != names:
        missing, extra = [n for n in names if n not in attrs], [a for a in attrs if a not in names]
        raise ImportError(f"pushpull.config: Config's attributes and SETTINGS differ: settings without an "
                          f"attribute {missing}, attributes without a setting {extra}"
                          + ("" if missing or extra else " (same names, different order)"))


_check_fields()
DEFAULTS: Config = Config.defaults()  # read-only: the simulator's, the grid's and the codecs' defaults


def setting(name: str) -> Setting:
    """The table's row for ``name`` (a ``KeyError`` names an unknown one)."""
    return _BY_NAME[name]


def env_source(name: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(variable, raw value)`` that sets setting ``name`` in ``env`` (default ``os.environ``), as
    :func:`load_config` picks it: the ``PUSHPULL_*`` name first, then the aliases; None when unset.
    For a launcher that must act on one setting before the whole configuration is read."""
    env = os.environ if env is None else env
    s = _BY_NAME[name]
    for var in (s.env, *s.aliases):
        raw = env.get(var)
        if raw is not None:
            return var, raw
    return None


def read_setting(name: str, env: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """``(value, source)`` of setting ``name`` in ``env`` (default ``os.environ``), parsed as the table says;
    source is the variable that set it, or ``"default"``. A malformed value raises :class:`ConfigError`
    naming the variable, the value and what it accepts. :func:`load_config` reads every setting with it; a
    launcher that needs one setting before the whole configuration calls it alone."""
    found = env_source(name, env)
    s = _BY_NAME[name]
    if found is None:
        return s.default, "default"
    var, raw = found
    try:
        return s.parse(raw), var
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{var}={raw!r} is invalid: {e}; {var} accepts {s.accepts}") from None


BYTEPS_PARTITION_BYTES = 4096000   # BytePS's key size, kept up to REFERENCE_SERVERS servers
REFERENCE_SERVERS = 4
MIN_DEFAULT_PARTITION_BYTES = 65536


def default_partition_bytes(num_server: int) -> int:
    """The key size a job gets when BYTEPS_PARTITION_BYTES is unset. A step's first key cannot be pulled
    before every worker pushed it and its last key is pulled after every other transfer: each costs about
    k x key / B on the links (k servers, every worker holding a share of each server's keys), while the
    step's own traffic per link does not grow with k. So beyond k = 4 the key shrinks as 1/k, which keeps
    that fill and drain as short as BytePS's 4,096,000-byte keys give at k = 4."""
    k = max(1, int(num_server))
    if k <= REFERENCE_SERVERS:
        return BYTEPS_PARTITION_BYTES
    return max(MIN_DEFAULT_PARTITION_BYTES, BYTEPS_PARTITION_BYTES * REFERENCE_SERVERS // k)


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """Read every setting from ``env`` (default ``os.environ``).

    The ``PUSHPULL_*`` name wins over an alias; a malformed value raises
    :class:`ConfigError` naming the variable, the value and what it accepts.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        values[s.name], sources[s.name] = read_setting(s.name, env)
    if sources["partition_bytes"] == "default":
        values["partition_bytes"] = default_partition_bytes(values["num_server"])
    _cap_partition_bytes(values, sources)
    cfg = Config(**values, sources=sources)
    _check_consistency(cfg)
    return cfg


def _named(sources: Mapping[str, str], name: str) -> str:
    """The variable a message about setting ``name`` should name: the one that set it, else its own."""
    src = sources.get(name, "default")
    return _BY_NAME[name].env if src == "default" else src


def _check_consistency(cfg: Config) -> None:
    if cfg.trace_end_step < cfg.trace_start_step:
        raise ConfigError(
            f"{_named(cfg.sources, 'trace_end_step')}={cfg.trace_end_step} is before "
            f"{_named(cfg.sources, 'trace_start_step')}={cfg.trace_start_step}")
    if cfg.root_port > 65535:
        raise ConfigError(f"{_named(cfg.sources, 'root_port')}={cfg.root_port} is invalid; accepts port 1..65535")
    if cfg.local_size is not None and cfg.local_size < 1:
        raise ConfigError(f"{_named(cfg.sources, 'local_size')}={cfg.local_size} is invalid; accepts integer >= 1")
    if cfg.local_rank is not None and cfg.local_size is not None and cfg.local_rank >= cfg.local_size:
        raise ConfigError(f"{_named(cfg.sources, 'local_rank')}={cfg.local_rank} must be < "
                          f"{_named(cfg.sources, 'local_size')}={cfg.local_size}")


_capped_warned: set = set()  # (asked, cap) pairs already warned about: one warning per process


def _cap_partition_bytes(values: dict, sources: dict) -> None:
    """A worker's partition size larger than a message can carry is capped at what fits, with one warning.

    BytePS reads BYTEPS_PARTITION_BYTES as a maximum (its own tests set 2147483647 to mean "do not
    partition"), so a script that sets it large must run. Only workers cut tensors into partitions: the
    scheduler and the servers carry no partitions of their own and do not look at it."""
    if values["role"] != "worker":
        return
    cap = values["max_message_bytes"] // 2 - 65536
    asked = values["partition_bytes"]
    if asked <= cap:
        return
    values["partition_bytes"] = cap
    if (asked, cap) not in _capped_warned:
        _capped_warned.add((asked, cap))
        import logging

        limit = "PUSHPULL_MAX_MESSAGE_BYTES"
        logging.getLogger("pushpull").warning(
            "%s=%d is larger than a partition can be with %s=%d (half of it, less 64 KiB for headers): "
            "partitions of %d bytes are used instead; raise %s for larger ones",
            _named(sources, "partition_bytes"), asked, limit, values["max_message_bytes"], cap, limit)


def max_partition_bytes(cfg: Config) -> int:
    """The largest partition a push may carry: half a message, less room for headers."""
    return cfg.max_message_bytes // 2 - 65536


def python_log_level(cfg: Config) -> int:
    import logging

    name = {"trace": "DEBUG", "fatal": "CRITICAL"}.get(cfg.log_level, cfg.log_level.upper())
    return getattr(logging, name)


def markdown_table() -> str:
    """The configuration reference, as written to ``docs/configuration.md``."""
    lines = [
        "# Configuration",
        "",
        "Every setting is read once at start-up by `pushpull/config.py`. The `PUSHPULL_*` name",
        "wins over its BytePS alias. A malformed value stops the process with a message naming",
        "the variable and what it accepts. Print the resolved values with `pushpull config`.",
        "",
        "Generated by `pushpull config --markdown`; `tests/unit/test_config.py` keeps it in sync.",
        "",
        "| variable | aliases | default | accepts | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        aliases = ", ".join(f"`{a}`" for a in s.aliases) or "-"
        default = "unset" if s.default is None else (int(s.default) if isinstance(s.default, bool) else s.default)
        lines.append(f"| `{s.env}` | {aliases} | `{default}` | {s.accepts} | {s.doc} |")
    lines.append("")
    lines.append("Rank discovery for workers, when `DMLC_WORKER_ID` is unset: torchrun (`RANK`, `LOCAL_RANK`,")
    lines.append("`LOCAL_WORLD_SIZE`, `WORLD_SIZE`), SLURM (`SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`,")
    lines.append("`SLURM_NTASKS_PER_NODE`) and Open MPI (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,")
    lines.append("`OMPI_COMM_WORLD_LOCAL_SIZE`, `OMPI_COMM_WORLD_SIZE`) are read in that order.")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pushpull config", description="Print every setting and its resolved value.")
    p.add_argument("--markdown", action="store_true", help="print the docs/configuration.md table")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_table(), end="")
        return 0
    try:
        cfg = load_config()
    except ConfigError as e:
        print(f"pushpull config: {e}")
        return 2
    for s in SETTINGS:
        value = getattr(cfg, s.name)
        if s.name == "secret" and value:
            value = "<set, not shown>"
        print(f"{s.env:<36} {value!s:<16} ({cfg.sources[s.name]})")
    return 0


@dataclass(frozen=True)
class WorkerIdentity:
    rank: int
    local_rank: int
    local_size: int
    size: int
    source: str


def worker_identity(cfg: Config, env: Mapping[str, str] | None = None) -> WorkerIdentity:
    """Where this worker process sits: BytePS variables first, then torchrun,
    SLURM and Open MPI, so a job started by any of them needs no extra flags."""
    env = os.environ if env is None else env

    def geti(name: str) -> int | None:
        raw = env.get(name)
        if raw is None or raw == "":
            return None
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is invalid; accepts an integer") from None

    if cfg.worker_id is not None or not any(
            k in env for k in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")):
        local_size = cfg.local_size or 1
        local_rank = cfg.local_rank or 0
        worker_id = cfg.worker_id or 0
        if worker_id >= cfg.num_worker:
            raise ConfigError(f"{cfg.sources.get('worker_id', 'DMLC_WORKER_ID')}={worker_id} must be < "
                              f"{cfg.sources['num_worker']}={cfg.num_worker}")
        return WorkerIdentity(local_rank + worker_id * local_size, local_rank, local_size,
                              cfg.num_worker * local_size, "byteps")
    for rank_v, lrank_v, lsize_v, size_v, src in (
        ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "torchrun"),
        ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS", "slurm"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
         "OMPI_COMM_WORLD_SIZE", "openmpi"),
    ):
        rank = geti(rank_v)
        if rank is None:
            continue
        size = geti(size_v) or 1
        local_rank = geti(lrank_v) or 0
        local_size = geti(lsize_v) or 1
        if rank >= size:
            raise ConfigError(f"{rank_v}={rank} must be < {size_v}={size}")
        return WorkerIdentity(rank, local_rank, local_size, size, src)
    raise AssertionError("unreachable")
