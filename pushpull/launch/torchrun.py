"""Plain ``torchrun``: a job started without BytePS's roles starts its own scheduler and servers.

Why: a PyTorch user's first try is ``torchrun --nproc_per_node 2 train.py``; asking them to start a
scheduler and servers first (or to switch launcher) made that wait 120 s for a scheduler nobody started.

How: torchrun's rendezvous store (a TCPStore at MASTER_ADDR:MASTER_PORT, served by its agent) is where
the processes agree. Global rank 0 picks a free port for the scheduler and the job secret (unless
PUSHPULL_SECRET is set) and publishes both; every process reads them. Rank 0 starts the scheduler, and
the local rank 0 of every node starts PUSHPULL_SERVERS_PER_NODE servers, as child processes that die with
it (PR_SET_PDEATHSIG) and exit when the job ends. One BytePS "worker machine" per torchrun node:
DMLC_NUM_WORKER = nodes, BYTEPS_LOCAL_SIZE = processes per node.

The secret travels through torchrun's store, which has no authentication: on one machine (``--standalone``)
only local processes reach it; across machines set PUSHPULL_SECRET on every node yourself
(docs/security.md), or anyone who can reach the store can read it.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time

from pushpull.config import read_setting

log = logging.getLogger(__name__)

_STARTED: list[subprocess.Popen] = []
_STORES: list = []  # a TCPStore this process serves (rank 0 without torchrun's agent store)


def wanted(env=os.environ) -> bool:
    """Started by torchrun (its agent sets TORCHELASTIC_RUN_ID), with more than one process, and no
    BytePS roles or scheduler address given."""
    return ("TORCHELASTIC_RUN_ID" in env and "RANK" in env and int(env.get("WORLD_SIZE", "1")) > 1
            and not any(k in env for k in ("DMLC_ROLE", "PUSHPULL_ROLE", "DMLC_PS_ROOT_URI", "PUSHPULL_ROOT_URI")))


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(timeout: float = 120.0) -> None:
    """Agree on the scheduler's address and the secret through torchrun's store, set the DMLC_*/BYTEPS_*
    variables every pushpull process reads, and start this node's share of the scheduler and servers."""
    from torch.distributed import TCPStore

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank, local_world = int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "1"))
    if world % local_world:
        raise RuntimeError(f"torchrun: WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}; "
                           f"pushpull needs the same number of processes on every node")
    nodes = world // local_world
    node = int(env.get("GROUP_RANK", rank // local_world))
    per_node = read_setting("servers_per_node", env)[0]
    master = env.get("MASTER_ADDR", "127.0.0.1")
    # with torchrun's own store (its default) the agent serves it; without it (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    # MASTER_PORT is a fresh port for rank 0 to serve, as torch.distributed's env:// does (multi-tenant: a later
    # init_process_group in this process shares it)
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "True") == "True"
    store = TCPStore(master, int(env["MASTER_PORT"]), is_master=rank == 0 and not agent_store,
                     timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                     **({} if agent_store else {"multi_tenant": True}))
    if not agent_store and rank == 0:
        _STORES.append(store)  # served as long as this process lives
    port, secret = agree_job(store, f"pushpull/{env.get('TORCHELASTIC_RUN_ID')}/", rank, world,
                             lambda: (_free_port(master), env.get("PUSHPULL_SECRET") or secrets.token_urlsafe(32)),
                             timeout)
    if not env.get("PUSHPULL_SECRET") and not env.get("PUSHPULL_SECRET_FILE"):
        env["PUSHPULL_SECRET"] = secret
    start_job("torchrun", env, host=master, port=int(port), nodes=nodes, node=node, per_node=local_world,
              rank=rank, local_rank=local_rank, servers=per_node, drop=("RANK", "LOCAL_RANK", "GROUP_RANK"),
              what=f"{nodes} node(s) x {local_world} process(es); scheduler {master}:{port}")


def agree_job(store, prefix: str, rank: int, world: int, pick, timeout: float) -> tuple[int, str]:
    """Rank 0's choice of the scheduler's port and the secret (``pick()``), as every rank of this rendezvous round
    reads it from torchrun's store. Why not one key that rank 0 sets: torchrun's store outlives a round (the
    agent serves one store for as long as the same node leads, under --nnodes MIN:MAX too), so a rank of a new
    round could read the last round's choice before rank 0 replaces it, and register with a dead scheduler; and
    no round number is common to every node (a node that joined later counts its restarts from 0). So each rank
    asks with a fresh nonce, and rank 0 answers each nonce it finds, until every rank has said it read this
    round's answer (stale nonces of an earlier round get an answer nobody reads)."""
    if rank == 0:
        port, secret = pick()
        token = secrets.token_hex(8)
        answer = json.dumps({"port": port, "secret": secret, "token": token})
        answered: set[str] = set()
        waiting = set(range(1, world))
        deadline = time.monotonic() + timeout
        while waiting:
            for r in sorted(waiting):
                if store.check([f"{prefix}ack/{r}/{token}"]):
                    waiting.discard(r)
                elif store.check([f"{prefix}ask/{r}"]):
                    nonce = store.get(f"{prefix}ask/{r}").decode()
                    if nonce not in answered:
                        store.set(f"{prefix}answer/{nonce}", answer)
                        answered.add(nonce)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"torchrun: rank(s) {sorted(waiting)} did not read the pushpull job's address "
                                   f"from torchrun's store within {timeout:g}s")
            if waiting:
                time.sleep(0.02)
        return port, secret
    nonce = secrets.token_hex(8)
    store.set(f"{prefix}ask/{rank}", nonce)
    store.wait([f"{prefix}answer/{nonce}"], datetime.timedelta(seconds=timeout))
    got = json.loads(store.get(f"{prefix}answer/{nonce}"))
    store.set(f"{prefix}ack/{rank}/{got['token']}", "1")
    return int(got["port"]), str(got["secret"])


def start_job(who: str, env, *, host: str, port: int, nodes: int, node: int, per_node: int, rank: int,
              local_rank: int, servers: int, drop: tuple, what: str) -> None:
    """The job a launcher that starts only the training processes (torchrun, srun, mpirun) agreed on, in the
    DMLC_*/BYTEPS_* variables every pushpull process reads: one BytePS "worker machine" per node of
    ``per_node`` processes, ``servers`` per node. Then global rank 0 starts the scheduler and every node's
    local rank 0 its servers, as children that die with it (PR_SET_PDEATHSIG) and exit when the job ends;
    ``drop``: the launcher's rank variables, which the roles must not read as a worker's."""
    from pushpull.launch.cli import _die_with_parent

    env.update({"DMLC_PS_ROOT_URI": host, "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_WORKER": str(nodes),
                "DMLC_NUM_SERVER": str(nodes * servers), "DMLC_WORKER_ID": str(node),
                "BYTEPS_LOCAL_SIZE": str(per_node), "BYTEPS_LOCAL_RANK": str(local_rank)})
    env.setdefault("PUSHPULL_SHUTDOWN", "keep")  # the launcher owns the job's life: init() may follow shutdown()
    roles = (["scheduler"] if rank == 0 else []) + (["server"] * servers if local_rank == 0 else [])
    for role in roles:
        child_env = {k: v for k, v in env.items() if k not in drop}
        child_env.update(DMLC_ROLE=role)
        _STARTED.append(subprocess.Popen([sys.executable, "-m", "pushpull.launch.role", role], env=child_env,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
    if roles:
        log.info("%s: started %s for %s", who, ", ".join(roles), what)
