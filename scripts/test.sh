#!/usr/bin/env bash
# The whole test suite (what CI runs): install, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# two pytest-xdist workers: most cluster tests wait on timeouts, deadlines and other processes, so two run in
# about the time of one; tests/conftest.py keeps each file, and the files sharing Slurm or the namespaces, on one
# worker. PUSHPULL_TEST_PROCS=0 runs them in this process, one after another.
exec "${PYTHON:-python3}" -m pytest -q -n "${PUSHPULL_TEST_PROCS:-2}" --dist loadgroup "$@"
