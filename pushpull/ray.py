"""Ray: a pushpull job whose scheduler, servers and workers are Ray actors (``pushpull.ray.RayExecutor``).

Why an executor and not a Ray Train backend: an executor (Horovod's ``horovod.ray.RayExecutor``) is the
smallest thing a Ray user with a training function needs: ``start()``, ``run(fn)`` on every worker,
``shutdown()``; it works on any Ray cluster (KubeRay included) with nothing but ``ray`` installed, and
the function is the same one ``pushpull launch`` runs. Ray Train's backend interface changes between Ray
releases and would tie pushpull to them.

How: one placement group holds a bundle per role (so Ray reserves the whole job or none of it: a job never
starts with half its servers); the scheduler's actor picks a free port on its node and starts the scheduler
there; every server and worker gets that address and the job's secret (CURVE keys are derived from it:
``PUSHPULL_SECRET``, or a fresh one per executor); scheduler and servers run as child processes of their
actors (``python -m pushpull.launch.role``) that die with them (PR_SET_PDEATHSIG), and every worker runs
the user's function in its actor process, with the DMLC_* environment of one BytePS worker machine each.

Security: the secret travels to the actors through Ray's own channels, so anyone who can run code on the
Ray cluster can read it: the job trusts the Ray cluster, as a Slurm job trusts its allocation.
"""
from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import time
from typing import Any, Callable

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

log = logging.getLogger(__name__)


class _Role:
    """The scheduler or one server: a child process of this actor (it ends when the actor does)."""

    def __init__(self, role: str, env: dict):
        self.role = role
        self.env = dict(os.environ) | env | {"DMLC_ROLE": role}
        self.proc: subprocess.Popen | None = None

    def start(self, port: int | None = None) -> tuple[str, int]:
        """Start the role; the scheduler takes a free port on this node's address. Returns (host, port)."""
        from pushpull.launch.cli import _die_with_parent
        from pushpull.launch.torchrun import _free_port

        host = ray.util.get_node_ip_address()
        if self.role == "scheduler":
            port = _free_port(host)
            self.env.update(DMLC_PS_ROOT_URI=host, DMLC_PS_ROOT_PORT=str(port))
        self.proc = subprocess.Popen([sys.executable, "-m", "pushpull.launch.role", self.role], env=self.env,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        return host, int(self.env["DMLC_PS_ROOT_PORT"])

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self, grace: float = 5.0) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.returncode()


class _Worker:
    """One worker: the user's function runs here, with the job's DMLC_* environment."""

    def __init__(self, env: dict):
        os.environ.update(env)

    def node(self) -> str:
        return ray.util.get_node_ip_address()

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)


class RayExecutor:
    """Run a pushpull job on a Ray cluster (``ray.init()`` first, or let :meth:`start` connect).

    ``num_workers`` training processes, ``num_servers`` parameter servers (default: one per worker, BytePS's
    advice), and the scheduler; ``cpus_per_worker`` / ``gpus_per_worker`` / ``cpus_per_server`` reserve
    resources per actor; ``placement_strategy``: Ray's (``PACK``, ``SPREAD``, ``STRICT_PACK``,
    ``STRICT_SPREAD``); ``env``: more variables for every role (PUSHPULL_*, BYTEPS_*); ``timeout``: seconds
    for the actors to be placed and started, and the default deadline of :meth:`run`.

    ``run(fn, args, kwargs)`` calls ``fn`` on every worker (it calls ``pushpull.torch.init()`` as under
    ``pushpull launch``) and returns the results in rank order; it can be called again with the same job
    (``PUSHPULL_SHUTDOWN=keep``: ``init()`` after ``shutdown()`` takes the same membership up again)."""

    def __init__(self, num_workers: int, num_servers: int | None = None, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, cpus_per_server: float = 1, placement_strategy: str = "PACK",
                 env: dict | None = None, timeout: float = 300.0):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: a job needs at least one worker")
        self.num_workers = num_workers
        self.num_servers = num_workers if num_servers is None else num_servers
        if self.num_servers < 1:
            raise ValueError(f"num_servers={self.num_servers}: a job needs at least one server")
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.cpus_per_server = cpus_per_server
        self.placement_strategy = placement_strategy
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.timeout = timeout
        self.pg = None
        self.scheduler = None
        self.servers: list = []
        self.workers: list = []

    # ------------------------------------------------------------------ lifecycle --
    def start(self) -> None:
        """Reserve the job's resources, start the scheduler and servers, and make the workers."""
        if not ray.is_initialized():
            ray.init()
        bundles = ([{"CPU": 0.1}] + [{"CPU": self.cpus_per_server}] * self.num_servers
                   + [{"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}]
                   * self.num_workers)
        self.pg = placement_group(bundles, strategy=self.placement_strategy)
        try:
            ray.get(self.pg.ready(), timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise TimeoutError(f"RayExecutor: the cluster could not place {len(bundles)} bundles ({bundles[1:2]} x "
                               f"{self.num_servers} servers, {bundles[-1:]} x {self.num_workers} workers) within "
                               f"{self.timeout:.0f}s; ray.cluster_resources() says {ray.cluster_resources()}") from None
        env = {"PUSHPULL_SECRET": os.environ.get("PUSHPULL_SECRET") or secrets.token_urlsafe(32),
               "DMLC_NUM_WORKER": str(self.num_workers), "DMLC_NUM_SERVER": str(self.num_servers),
               "PUSHPULL_SHUTDOWN": "keep", **self.env}
        try:
            self.scheduler = self._actor(_Role, 0, 0.1).remote("scheduler", env)
            host, port = ray.get(self.scheduler.start.remote(), timeout=self.timeout)
            env.update(DMLC_PS_ROOT_URI=host, DMLC_PS_ROOT_PORT=str(port))
            self.servers = [self._actor(_Role, 1 + k, self.cpus_per_server).remote("server", env)
                            for k in range(self.num_servers)]
            ray.get([s.start.remote() for s in self.servers], timeout=self.timeout)
            first = 1 + self.num_servers
            self.workers = [self._actor(_Worker, first + r, self.cpus_per_worker, self.gpus_per_worker)
                            .remote(env | {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(r)})
                            for r in range(self.num_workers)]
            ray.get([w.node.remote() for w in self.workers], timeout=self.timeout)
        except BaseException:
            self.shutdown()
            raise
        log.info("RayExecutor: scheduler %s:%d, %d server(s), %d worker(s)", host, port, self.num_servers,
                 self.num_workers)

    def _actor(self, cls, bundle: int, cpus: float, gpus: float = 0):
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle)
        return ray.remote(cls).options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=strategy)

    def run(self, fn: Callable, args: tuple = (), kwargs: dict | None = None, timeout: float | None = None) -> list:
        """``fn(*args, **kwargs)`` on every worker, the results in rank order. A worker that raises, or whose
        actor dies, fails the call naming its rank; past ``timeout`` (default: the executor's) it raises
        TimeoutError naming the ranks that had not finished, and so does a scheduler or server that exits."""
        if not self.workers:
            raise RuntimeError("RayExecutor.run before start()")
        refs = [w.run.remote(fn, tuple(args), dict(kwargs or {})) for w in self.workers]
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as ex:  # noqa: BLE001 - named and raised below
                    raise RuntimeError(f"RayExecutor.run: worker rank {refs.index(ref)} failed: {ex}") from ex
            dead = self._dead_role()
            if pending and dead:
                raise RuntimeError(f"RayExecutor.run: the {dead}; ranks {[refs.index(p) for p in pending]} "
                                   f"had not finished")
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"RayExecutor.run: ranks {[refs.index(p) for p in pending]} had not finished "
                                   f"within {limit:.0f}s")
        return ray.get(refs)

    def _dead_role(self) -> str | None:
        """'scheduler exited with code 1' (or a server's) when a role process ended while workers run."""
        roles = [("scheduler", self.scheduler)] + [(f"server {k}", s) for k, s in enumerate(self.servers)]
        codes = ray.get([actor.returncode.remote() for _, actor in roles])
        for (name, _), code in zip(roles, codes):
            if code is not None:
                return f"{name} exited with code {code}"
        return None

    def role_pids(self) -> list[int]:
        """The scheduler's and servers' process ids (on their nodes), for a check that none outlives the job."""
        roles = ([self.scheduler] if self.scheduler else []) + self.servers
        return [p for p in ray.get([r.pid.remote() for r in roles]) if p is not None]

    def shutdown(self) -> None:
        """Stop every role and release the placement group (idempotent)."""
        roles = [*self.servers, *([self.scheduler] if self.scheduler else [])]
        try:  # a clean exit first (a server unlinks its shared memory); killing the actor ends the rest
            ray.get([r.stop.remote() for r in roles], timeout=15)
        except Exception:  # noqa: BLE001 - it is going away anyway
            pass
        for actor in [*self.workers, *roles]:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
        self.workers, self.servers, self.scheduler = [], [], None
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None

    def __enter__(self) -> "RayExecutor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
