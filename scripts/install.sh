#!/usr/bin/env bash
# Installs pushpull and everything its jobs, benchmarks and tests need.
# torch is pinned to the CPU build first: an unpinned 'torch' would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[torch,bench,test,metrics,huggingface,lightning,ray]"
# TensorFlow 2 / Keras 3 bindings (tensorflow-cpu: no CUDA packages); their tests run in CI
"$PY" -m pip install --quiet -e ".[tensorflow]"
# MXNet binding: mxnet 1.9.1 needs NumPy < 1.24, so it gets an environment of its own (.venv-mxnet).
# Best effort: without it tests/cluster/test_mxnet_api.py skips saying why.
# TensorFlow and Keras without torch (tests/cluster/test_no_torch.py): a fresh environment with the
# [tensorflow] extra only, so that the tests prove the bindings, scheduler and servers need no torch
if [ "${PUSHPULL_SKIP_NOTORCH:-0}" != 1 ] \
    && ! .venv-notorch/bin/python -c 'import tensorflow, sklearn, pushpull.tensorflow' >/dev/null 2>&1; then
  ("$PY" -m venv .venv-notorch && .venv-notorch/bin/python -m pip install --quiet -e ".[tensorflow]" \
      "scikit-learn>=1.2") >/dev/null 2>&1 \
    || echo "install.sh: could not make the torch-free environment (.venv-notorch); its tests will be skipped" >&2
fi
if [ "${PUSHPULL_SKIP_MXNET:-0}" != 1 ]; then
  bash scripts/test-mxnet.sh --install-only >/dev/null 2>&1 \
    || echo "install.sh: could not make the MXNet environment (.venv-mxnet); its tests will be skipped" >&2
fi
# The emulated cluster shapes links with tc (iproute2) and, on kernels without
# sch_netem, delays packets through iptables' NFQUEUE. Best effort: without
# root or apt the emulation falls back to loopback and its tests say so.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
  command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
  # the launchers users already have: tests/cluster/test_mpi.py and test_slurm.py run the real ones
  command -v mpirun >/dev/null 2>&1 || missing="$missing openmpi-bin"
  command -v slurmctld >/dev/null 2>&1 || missing="$missing slurm-wlm"
  if [ -n "$missing" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 \
      || echo "install.sh: could not install$missing; the tests that need them will be skipped" >&2
  fi
fi
