"""Emulated cluster on one machine: network namespaces, a bridge, tc shaping.

See docs/emulation.md. Entry points: :class:`EmulatedCluster`,
:func:`launch_job` / :func:`launch_torch_job`, :func:`cleanup`, and the
``pushpull cluster`` command.
"""
from pushpull.emulate.jobs import Job, JobError, launch_job, launch_torch_job
from pushpull.emulate.netns import EmulatedCluster, EmulationError, cleanup, netns_unavailable_reason

__all__ = ["EmulatedCluster", "EmulationError", "Job", "JobError", "cleanup", "launch_job",
           "launch_torch_job", "netns_unavailable_reason"]
