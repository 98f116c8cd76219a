#!/usr/bin/env bash
# Installs pushpull and everything its jobs, benchmarks and tests need.
# torch is pinned to the CPU build first: an unpinned 'torch' would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[bench,test]"
