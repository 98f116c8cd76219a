#!/usr/bin/env bash
# CUDA tensors through every path on a machine with a GPU (tests/cluster/test_cuda.py): push_pull of every
# dtype, the optimizer wrapper, each compressor, Horovod's collectives, the broadcasts, DiLoCo (plain and
# streaming), and the all-reduce backend (NCCL, or gloo where ranks share a GPU). Prints the GPU and
# versions, one line per case, and one summary line last. Without CUDA it says so and exits 0. Uses the
# machine's own torch (a CUDA build): the CPU wheel scripts/install.sh pins has no CUDA, so nothing is
# installed here; pyzmq and cryptography must be importable (pip install -e . where the machine can reach an
# index; scripts/device-check.sh carries wheels).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: no CUDA device here (torch.cuda.is_available() is false); nothing to check"
  exit 0
fi
nvidia-smi -L 2>/dev/null || true
"$PY" - <<'PYEOF'
import torch, zmq
print(f"torch {torch.__version__}, CUDA devices {torch.cuda.device_count()}, nccl {torch.cuda.nccl.version()}, "
      f"pyzmq {zmq.__version__}")
PYEOF
log=$(mktemp)
timeout "${GPU_CHECK_TIMEOUT:-300}" "$PY" -m pytest -v -p no:cacheprovider tests/cluster/test_cuda.py "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "gpu-check: $(grep -E '^=+ .* in [0-9.]+s' "$log" | tail -1 | tr -d '=' | xargs) (exit $rc)"
rm -f "$log"
exit "$rc"
