"""srun and mpirun start their own scheduler and servers (pushpull.launch.hpc): who starts, where, which port."""
from __future__ import annotations

import pytest

from pushpull.launch import hpc

SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
         "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4711",
         "SLURM_STEP_ID": "0"}
MPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-vm-123@1"}


@pytest.mark.parametrize("env,want", [(SLURM, "slurm"), (MPI, "openmpi"), ({**SLURM, "SLURM_NTASKS": "1"}, None),
                                      ({**MPI, "DMLC_ROLE": "worker"}, None),
                                      ({**MPI, "DMLC_PS_ROOT_PORT": "9000"}, None),
                                      ({**SLURM, "TORCHELASTIC_RUN_ID": "x"}, None),
                                      ({k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}, None)],
                         ids=["srun", "mpirun", "one-task", "byteps-roles", "own-scheduler", "torchrun",
                              "allocation-not-srun"])
def test_which_launcher_starts_the_cluster(env, want):
    assert hpc.which(env) == want


@pytest.mark.parametrize("nodelist,first", [("gpu[07-08]", "gpu07"), ("node[3,5-9],x1", "node3"),
                                            ("single", "single"), ("a-b[001-004]", "a-b001")])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert hpc.first_host(nodelist) == first


def test_slurm_placement_puts_the_scheduler_on_the_first_node():
    p = hpc.placement("slurm", SLURM)
    assert (p["rank"], p["local_rank"], p["per_node"], p["nodes"], p["node"], p["host"]) == (3, 1, 2, 2, 1, "gpu07")


def test_one_node_stays_on_loopback():
    env = {**SLURM, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "SLURM_PROCID": "1"}
    assert hpc.placement("slurm", env)["host"] == "127.0.0.1"


def test_the_port_is_the_jobs_own_and_the_same_in_every_process():
    a = hpc.placement("slurm", SLURM)["port"]
    assert a == hpc.placement("slurm", {**SLURM, "SLURM_PROCID": "0", "SLURM_NODEID": "0"})["port"]
    assert a != hpc.placement("slurm", {**SLURM, "SLURM_STEP_ID": "1"})["port"]
    assert hpc.PORT_BASE <= a < hpc.PORT_BASE + hpc.PORT_SPAN


def test_uneven_tasks_per_node_are_refused_naming_the_fix():
    with pytest.raises(ValueError, match="ntasks-per-node"):
        hpc.placement("slurm", {**SLURM, "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "2,1"})


def test_mpi_over_nodes_needs_the_schedulers_host():
    with pytest.raises(ValueError, match="DMLC_PS_ROOT_URI"):
        hpc.placement("openmpi", MPI)
    p = hpc.placement("openmpi", {**MPI, "DMLC_PS_ROOT_URI": "node0"})
    assert (p["node"], p["nodes"], p["host"]) == (1, 2, "node0")


def test_mpirun_inside_a_slurm_allocation_is_open_mpi():
    """Its ranks inherit the Slurm step's variables (the same SLURM_PROCID on a node): Open MPI's count."""
    assert hpc.which({**SLURM, **MPI}) == "openmpi"


def test_ranks_mapped_by_node_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="map-by slot"):
        hpc.placement("openmpi", {**MPI, "DMLC_PS_ROOT_URI": "node0", "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
