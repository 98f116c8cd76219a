#!/usr/bin/env bash
# CUDA tensors through every path (push_pull, the optimizer wrapper, each compressor, the collectives, the
# broadcasts, and the all-reduce backend's NCCL) on a machine with a GPU: tests/cluster/test_cuda.py, which
# skips where CUDA is absent. Prints the GPU, the versions and one pytest line per case.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
nvidia-smi -L 2>/dev/null || echo "gpu-check: nvidia-smi not found"
"$PY" - <<'PYEOF'
import torch, zmq
print(f"torch {torch.__version__}, cuda available {torch.cuda.is_available()}, "
      f"devices {torch.cuda.device_count()}, nccl {torch.cuda.nccl.version() if torch.cuda.is_available() else '-'}, "
      f"pyzmq {zmq.__version__}")
PYEOF
exec timeout "${GPU_CHECK_TIMEOUT:-300}" "$PY" -m pytest -v -p no:cacheprovider tests/cluster/test_cuda.py "$@"
