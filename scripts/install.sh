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
# The emulated cluster shapes links with tc (iproute2) and, on kernels without
# sch_netem, delays packets through iptables' NFQUEUE. Best effort: without
# root or apt the emulation falls back to loopback and its tests say so.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
  command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
  if [ -n "$missing" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 \
      || echo "install.sh: could not install$missing; emulated-cluster delay tests will be skipped" >&2
  fi
fi
