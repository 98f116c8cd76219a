"""Test groups for pytest-xdist (scripts/test.sh runs ``-n 2 --dist loadgroup``): a worker runs whole groups."""
from __future__ import annotations

import pytest

# The cluster tests that share one thing of this machine's run on one worker: the single local Slurm (the
# ``slurm`` fixture), and the network namespaces with their iptables rules.
_SHARED = {"cluster/test_slurm.py": "slurm", "cluster/test_lightning.py": "slurm",
           "cluster/test_bench_grid.py": "netns", "cluster/test_emulate.py": "netns",
           "cluster/test_sealed_lane.py": "netns"}


def pytest_collection_modifyitems(config, items):
    """Each test's group: its file's (a file caches its jobs' output in its module, so it stays on one worker;
    tests/unit and tests/cluster files of one name stay apart), or the shared thing's above."""
    for item in items:
        name = f"{item.path.parent.name}/{item.path.name}"
        item.add_marker(pytest.mark.xdist_group(_SHARED.get(name, name)))
