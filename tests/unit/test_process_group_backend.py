"""Which torch.distributed backend the all-reduce backend joins with (pushpull.torch.allreduce_backend):
NCCL for CUDA tensors only where every rank of a host has a GPU of its own (NCCL refuses two ranks on one GPU,
'Duplicate GPU detected', as the one-GPU machine of scripts/gpu-check.sh showed)."""
import logging

import pytest

from pushpull.torch.allreduce_backend import process_group_backend


def test_cpu_only_machine_uses_gloo():
    assert process_group_backend(False) == "gloo"


def test_gpu_per_rank_uses_nccl_for_cuda_and_gloo_for_cpu():
    assert process_group_backend(True, local_size=4, gpus=8) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(True, local_size=1, gpus=1) == "cpu:gloo,cuda:nccl"


def test_ranks_sharing_a_gpu_fall_back_to_gloo_and_say_why(caplog):
    with caplog.at_level(logging.WARNING, logger="pushpull.torch.allreduce_backend"):
        assert process_group_backend(True, local_size=2, gpus=1) == "gloo"
    assert "2 ranks on this host share 1 GPU" in caplog.text and "NCCL" in caplog.text


@pytest.mark.parametrize("interface, before, after", [
    ("veth0", None, "veth0"),       # the job's interface, where gloo has none of its own
    ("veth0", "eth1", "eth1"),      # GLOO_SOCKET_IFNAME set by the user wins
    (None, None, None),             # nothing named: gloo chooses as it always did
], ids=["job-interface", "user-setting-wins", "none"])
def test_gloo_uses_the_jobs_interface(interface, before, after):
    from pushpull.torch.allreduce_backend import use_job_interface

    env = {} if before is None else {"GLOO_SOCKET_IFNAME": before}
    use_job_interface(interface, env)
    assert env.get("GLOO_SOCKET_IFNAME") == after
