"""``srun python train.py`` and ``mpirun -np N python train.py``: the job starts its own scheduler and servers.

Why: on a cluster the user hands the job to Slurm or MPI, which start the training processes and tell each
its rank, and nothing else: asking them to write DMLC_* variables or to run ``pushpull launch`` inside the
allocation is the step where they give up. torchrun has the same integration (pushpull.launch.torchrun).

How the processes agree without talking (Slurm and Open MPI give no store to agree through):

* **where**: the scheduler on the first node of the allocation (Slurm: the first host of SLURM_JOB_NODELIST;
  Open MPI on several nodes: DMLC_PS_ROOT_URI, which ``mpirun -x`` passes, since Open MPI names no node);
  127.0.0.1 when the job has one node;
* **the port**: from the job's own id (Slurm: SLURM_JOB_ID and SLURM_STEP_ID; Open MPI: its PMIx namespace or
  job id), the same in every process and different for every job step, in 20000-49999;
* **the secret**: PUSHPULL_SECRET or PUSHPULL_SECRET_FILE as exported to the job (``sbatch`` passes the
  environment; ``mpirun -x PUSHPULL_SECRET``); a job on one node with neither uses the user's local secret
  (pushpull.transport.security.local_secret);
* **roles**: global rank 0 starts the scheduler and each node's local rank 0 PUSHPULL_SERVERS_PER_NODE
  servers; one BytePS "worker machine" per node (DMLC_NUM_WORKER = nodes, BYTEPS_LOCAL_SIZE = tasks per
  node). Open MPI's node of a rank is rank // local size: ranks placed by slot (its default), as torchrun's.

It applies when the process runs under srun or mpirun with more than one task and no BytePS roles or
scheduler port are given (DMLC_ROLE, DMLC_PS_ROOT_PORT: then the user runs their own cluster).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re

from pushpull.config import read_setting

log = logging.getLogger(__name__)

PORT_BASE, PORT_SPAN = 20000, 30000


def which(env=os.environ) -> str | None:
    """'slurm' or 'openmpi' when this process should start its job's scheduler and servers, else None."""
    if any(k in env for k in ("DMLC_ROLE", "PUSHPULL_ROLE", "DMLC_PS_ROOT_PORT", "PUSHPULL_ROOT_PORT")):
        return None
    if "TORCHELASTIC_RUN_ID" in env:
        return None  # torchrun's own integration
    # mpirun inside a Slurm allocation: its ranks inherit the Slurm variables of the step that started Open
    # MPI's daemons (the same SLURM_PROCID on every rank of a node), so Open MPI's own come first
    if "OMPI_COMM_WORLD_RANK" in env:
        return "openmpi" if int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1 else None
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    return None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[03-05,9],gpu1`` -> ``node03``."""
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"SLURM_JOB_NODELIST={nodelist!r} is not a host list")
    prefix, ranges = m.group(1), m.group(3)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def tasks_per_node(value: str) -> int:
    """SLURM_TASKS_PER_NODE's first node: ``2(x3),1`` -> 2."""
    m = re.match(r"(\d+)", value or "")
    if not m:
        raise ValueError(f"SLURM_TASKS_PER_NODE={value!r}: expected a number of tasks")
    return int(m.group(1))


def job_port(job: str) -> int:
    """A port every process of the job computes alike from its id (SHA-256: no two steps alike by design)."""
    return PORT_BASE + int.from_bytes(hashlib.sha256(job.encode()).digest()[:4], "big") % PORT_SPAN


def placement(kind: str, env) -> dict:
    """rank, size, local rank, tasks per node, node index, nodes, scheduler host and job id from the
    launcher's own variables; ValueError naming the variable when the job cannot be laid out."""
    if kind == "slurm":
        rank, size = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local_rank = int(env.get("SLURM_LOCALID", "0"))
        per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
                                  or env.get("SLURM_NTASKS_PER_NODE") or "1")
        nodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        node = int(env.get("SLURM_NODEID", "0"))
        if per_node * nodes != size:
            raise ValueError(f"srun: {size} tasks on {nodes} node(s) are not {per_node} per node "
                             f"(SLURM_TASKS_PER_NODE={env.get('SLURM_TASKS_PER_NODE')!r}); pushpull needs the "
                             f"same number on every node (srun --ntasks-per-node)")
        host = "127.0.0.1" if nodes == 1 else first_host(env.get("SLURM_STEP_NODELIST")
                                                           or env.get("SLURM_JOB_NODELIST", ""))
        job = f"slurm:{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')}"
    else:
        rank, size = int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"])
        local_rank = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        per_node = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
        if size % per_node:
            raise ValueError(f"mpirun: {size} ranks are not a multiple of OMPI_COMM_WORLD_LOCAL_SIZE={per_node}; "
                             f"pushpull needs the same number on every node (mpirun --map-by slot, -npernode)")
        nodes, node = size // per_node, rank // per_node
        if local_rank != rank % per_node:
            raise ValueError(f"mpirun: rank {rank} is local rank {local_rank} of its node, not {rank % per_node}: "
                             f"ranks must fill one node after another (mpirun --map-by slot, Open MPI's default)")
        host = env.get("DMLC_PS_ROOT_URI") or env.get("PUSHPULL_ROOT_URI") or ("127.0.0.1" if nodes == 1 else "")
        if not host:
            raise ValueError(f"mpirun over {nodes} nodes: Open MPI does not say which node rank 0 is on; pass it: "
                             f"mpirun -x DMLC_PS_ROOT_URI=<rank 0's host> -x PUSHPULL_SECRET ...")
        job = "openmpi:" + (env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid")
                            or env.get("OMPI_MCA_orte_hnp_uri") or env.get("OMPI_COMM_WORLD_SIZE", "?"))
    return {"rank": rank, "size": size, "local_rank": local_rank, "per_node": per_node, "nodes": nodes,
            "node": node, "host": host, "port": job_port(job), "job": job}


def start_cluster() -> None:
    """Set the DMLC_*/BYTEPS_* variables every pushpull process reads, and start this node's share of the
    scheduler and servers (pushpull.launch.torchrun.start_job)."""
    from pushpull.launch.torchrun import start_job

    env = os.environ
    kind = which(env)
    assert kind is not None
    try:
        p = placement(kind, env)
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    if p["nodes"] == 1:
        env.setdefault("DMLC_NODE_HOST", "127.0.0.1")
    start_job(kind, env, host=p["host"], port=p["port"], nodes=p["nodes"], node=p["node"], per_node=p["per_node"],
              rank=p["rank"], local_rank=p["local_rank"], servers=read_setting("servers_per_node", env)[0],
              drop=("SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
              what=f"{p['nodes']} node(s) x {p['per_node']} task(s); scheduler {p['host']}:{p['port']} ({p['job']})")
