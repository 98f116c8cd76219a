"""Run a distributed job across the hosts of an :class:`EmulatedCluster`.

``launch_job`` starts a pushpull (BytePS-style) job exactly as one would on
real machines: every process is ``python -m pushpull launch`` with its role in
``DMLC_*`` variables, one worker machine per host. ``launch_torch_job`` does the
same for a ``torch.distributed`` (gloo) job with the torchrun variables.

Both return a :class:`Job`; ``Job.wait(timeout)`` returns the exit codes or,
when any process fails or the timeout passes, kills everything and raises
:class:`JobError` with the tail of the culprit's output. Output of each process
goes to ``<log_dir>/<label>.log``.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pushpull.emulate.netns import EmulatedCluster, _terminate
from pushpull.launch.cli import ensure_job_secret

log = logging.getLogger(__name__)

DEFAULT_PS_PORT = 9000
DEFAULT_TORCH_PORT = 29500


class JobError(RuntimeError):
    """A job process failed or the job timed out; ``codes`` has every exit code."""

    def __init__(self, msg: str, codes: dict[str, int | None]):
        super().__init__(msg)
        self.codes = codes


@dataclass
class Proc:
    label: str  # "scheduler", "server0", "worker1", "rank0"
    host: int
    popen: subprocess.Popen
    log_path: Path
    is_worker: bool

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def result(self, marker: str = "RESULT ") -> dict:
        """The JSON a benchmark's worker printed after ``marker`` (its first such line); SystemExit with the end of
        its log if it printed none."""
        out = self.tail(1_000_000)
        line = next((ln for ln in out.splitlines() if marker in ln), None)
        if line is None:
            raise SystemExit(f"{self.label} printed no result:\n{out[-3000:]}")
        return json.loads(line[line.index(marker) + len(marker):])


@dataclass
class Job:
    procs: list[Proc] = field(default_factory=list)
    log_dir: Path | None = None
    finish_grace_s: float = 30.0

    def __getitem__(self, label: str) -> Proc:
        for p in self.procs:
            if p.label == label:
                return p
        raise KeyError(label)

    def codes(self) -> dict[str, int | None]:
        return {p.label: p.popen.poll() for p in self.procs}

    def kill(self) -> None:
        for p in self.procs:
            _terminate(p.popen)

    def wait(self, timeout: float) -> dict[str, int]:
        """Wait until every process exits 0; on failure or timeout kill all and raise.

        Servers and the scheduler are expected to exit by themselves once the
        workers finish; they get ``finish_grace_s`` to do so.
        """
        deadline = time.monotonic() + timeout
        workers_done = None
        try:
            while True:
                for p in self.procs:
                    rc = p.popen.poll()
                    if rc not in (None, 0):
                        raise JobError(f"{p.label} on host {p.host} failed with exit code {rc}; "
                                       f"its output ends with:\n{p.tail()}", self.codes())
                if all(p.popen.poll() == 0 for p in self.procs):
                    return {p.label: 0 for p in self.procs}
                now = time.monotonic()
                if workers_done is None and all(p.popen.poll() == 0 for p in self.procs if p.is_worker):
                    workers_done = now
                if workers_done is not None and now - workers_done > self.finish_grace_s:
                    left = [p.label for p in self.procs if p.popen.poll() is None]
                    raise JobError(f"workers finished but {', '.join(left)} did not exit within "
                                   f"{self.finish_grace_s:.0f} s", self.codes())
                if now > deadline:
                    left = [p.label for p in self.procs if p.popen.poll() is None]
                    raise JobError(f"job timed out after {timeout:.0f} s; still running: {', '.join(left)}",
                                   self.codes())
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise


def _placement(num_workers: int, num_servers: int, hosts: int, placement: str) -> tuple[list[int], list[int]]:
    """Host of each worker and each server."""
    if placement == "colocated":  # BytePS colocated: server j shares host j with worker j
        need = max(num_workers, num_servers)
        if hosts < need:
            raise ValueError(f"colocated placement of {num_workers} workers / {num_servers} servers "
                             f"needs {need} hosts, cluster has {hosts}")
        return list(range(num_workers)), list(range(num_servers))
    if placement == "separate":  # dedicated server machines after the workers
        need = num_workers + num_servers
        if hosts < need:
            raise ValueError(f"separate placement needs {need} hosts, cluster has {hosts}")
        return list(range(num_workers)), list(range(num_workers, need))
    raise ValueError(f"placement must be 'colocated' or 'separate', got {placement!r}")


def _start(cluster: EmulatedCluster, job: Job, label: str, host: int, argv: list[str], env: dict,
           is_worker: bool) -> None:
    assert job.log_dir is not None
    path = job.log_dir / f"{label}.log"
    with open(path, "wb") as out:
        p = cluster.popen(host, argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    job.procs.append(Proc(label, host, p, path, is_worker))
    log.debug("started %s on host %d (pid %d): %s", label, host, p.pid, " ".join(argv))


def _base_env(env: dict | None) -> dict:
    e = dict(os.environ)
    for k in ("DMLC_ROLE", "PUSHPULL_ROLE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "DMLC_WORKER_ID", "BYTEPS_LOCAL_RANK"):
        e.pop(k, None)
    e.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        e.update({k: str(v) for k, v in env.items()})
    return e


def launch_job(cluster: EmulatedCluster, num_workers: int, num_servers: int, worker_argv: Sequence[str],
               env: dict | None = None, placement: str = "colocated", port: int | None = None,
               scheduler_host: int = 0, log_dir: str | Path | None = None,
               python: str = sys.executable, launcher: Sequence[str] | None = None, local_size: int = 1) -> Job:
    """Start scheduler, servers and workers of a pushpull job on ``cluster``.

    Worker i runs on host i; server j on host j ('colocated', as BytePS
    recommends) or on host num_workers + j ('separate'); the scheduler on
    ``scheduler_host``. Each worker host is one BytePS worker machine running
    ``local_size`` worker processes (``BYTEPS_LOCAL_SIZE``; the launcher on the
    host starts them, ranks ``i * local_size + j``; with several, they reduce
    locally first unless ``PUSHPULL_LOCAL_REDUCE=0``). Returns the :class:`Job` at once; call
    ``job.wait(timeout)``. ``launcher`` replaces ``python -m pushpull launch``
    (a stand-in for tests, or ``bpslaunch``).
    """
    if num_workers < 1 or num_servers < 0:
        raise ValueError("need num_workers >= 1 and num_servers >= 0")
    w_hosts, s_hosts = _placement(num_workers, num_servers, cluster.hosts, placement)
    if port is None:
        port = DEFAULT_PS_PORT if cluster.emulated else _free_port()
    base = _base_env(env)
    base.update({
        "DMLC_PS_ROOT_URI": cluster.addr(scheduler_host),
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(num_workers),
        "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_INTERFACE": cluster.iface,
    })
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1, got {local_size}")
    base["BYTEPS_LOCAL_SIZE"] = str(local_size)  # the argument, not a value left in this shell
    ensure_job_secret(base)  # this function starts every process of the job, as the local launcher does
    # up to 17 processes importing torch on this machine's cores take longer than the default 15 s
    base.setdefault("PUSHPULL_REGISTER_TIMEOUT", "120")
    job = Job(log_dir=Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="pushpull-job-")))
    job.log_dir.mkdir(parents=True, exist_ok=True)
    launch = list(launcher) if launcher else [python, "-m", "pushpull", "launch"]
    try:
        _start(cluster, job, "scheduler", scheduler_host, launch,
               dict(base, DMLC_ROLE="scheduler", DMLC_NODE_HOST=cluster.addr(scheduler_host)), False)
        for j, h in enumerate(s_hosts):
            _start(cluster, job, f"server{j}", h, launch,
                   dict(base, DMLC_ROLE="server", DMLC_NODE_HOST=cluster.addr(h)), False)
        for i, h in enumerate(w_hosts):
            _start(cluster, job, f"worker{i}", h, launch + ["--", *worker_argv],
                   dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID=str(i), DMLC_NODE_HOST=cluster.addr(h)), True)
    except BaseException:
        job.kill()
        raise
    log.info("job on %s: %d workers on hosts %s, %d servers on hosts %s, scheduler %s:%d, logs in %s",
             cluster.prefix, num_workers, w_hosts, num_servers, s_hosts, cluster.addr(scheduler_host), port,
             job.log_dir)
    return job


def run_on_separate_hosts(worker_argv: Sequence[str], rate: str, congestion: str, env: dict, log_dir: str,
                          timeout: float, num_workers: int = 2, num_servers: int = 2) -> tuple[list[dict], bool, float]:
    """One job with its workers and servers on hosts of their own, every link shaped to ``rate``, run to its end:
    each worker's RESULT (:meth:`Proc.result`), whether the links were emulated (False: the loopback fallback, no
    shaping), and the wall time. The sparse and elastic benchmarks' job."""
    t0 = time.monotonic()
    with EmulatedCluster(num_workers + num_servers, rate=rate, congestion=congestion) as cluster:
        job = launch_job(cluster, num_workers, num_servers, worker_argv, placement="separate", log_dir=log_dir,
                         env=env)
        job.wait(timeout)
        results = [job[f"worker{i}"].result() for i in range(num_workers)]
        return results, cluster.emulated, time.monotonic() - t0


def launch_torch_job(cluster: EmulatedCluster, world_size: int, argv: Sequence[str], env: dict | None = None,
                     procs_per_host: int = 1, port: int | None = None, log_dir: str | Path | None = None) -> Job:
    """Start a ``torch.distributed`` job: rank r on host r // procs_per_host.

    Sets MASTER_ADDR (host 0), MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, and GLOO_SOCKET_IFNAME so that gloo uses the emulated link
    rather than whatever interface the host name resolves to.
    """
    hosts_needed = -(-world_size // procs_per_host)
    if hosts_needed > cluster.hosts:
        raise ValueError(f"{world_size} ranks at {procs_per_host} per host need {hosts_needed} hosts, "
                         f"cluster has {cluster.hosts}")
    if port is None:
        port = DEFAULT_TORCH_PORT if cluster.emulated else _free_port()
    base = _base_env(env)
    base.update({"MASTER_ADDR": cluster.addr(0), "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
                 "LOCAL_WORLD_SIZE": str(procs_per_host), "GLOO_SOCKET_IFNAME": cluster.iface})
    job = Job(log_dir=Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="pushpull-torch-")))
    job.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for r in range(world_size):
            h = r // procs_per_host
            _start(cluster, job, f"rank{r}", h, list(argv),
                   dict(base, RANK=str(r), LOCAL_RANK=str(r % procs_per_host)), True)
    except BaseException:
        job.kill()
        raise
    return job


def launch_torchrun_job(cluster: EmulatedCluster, nodes: int, nproc_per_node: int, argv: Sequence[str],
                        env: dict | None = None, port: int | None = None, log_dir: str | Path | None = None) -> Job:
    """Plain multi-node ``torchrun`` on the emulated hosts, one node per host: what a user without BytePS
    roles runs (pushpull starts its scheduler and servers itself, :mod:`pushpull.launch.torchrun`)."""
    if nodes > cluster.hosts:
        raise ValueError(f"{nodes} nodes need {nodes} hosts, cluster has {cluster.hosts}")
    if port is None:
        port = DEFAULT_TORCH_PORT if cluster.emulated else _free_port()
    base = _base_env(env)
    for k in ("PUSHPULL_SECRET", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER"):
        base.pop(k, None)
    base.update({"GLOO_SOCKET_IFNAME": cluster.iface})
    job = Job(log_dir=Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="pushpull-torchrun-")))
    job.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for h in range(nodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc_per_node",
                   str(nproc_per_node), "--node_rank", str(h), "--master_addr", cluster.addr(0), "--master_port",
                   str(port), *argv]
            _start(cluster, job, f"node{h}", h, cmd, dict(base, PUSHPULL_REGISTER_TIMEOUT="120"), True)
    except BaseException:
        job.kill()
        raise
    return job


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
