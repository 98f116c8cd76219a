#!/usr/bin/env bash
# One call on a lent GPU machine: issue 29 item 4 (DiLoCo within 2 % of synchronous at H = 100) at a budget
# this 2-core VM cannot reach. The 10.8 M-parameter GPT-2 of benchmarks/diloco_quality.py, 4 workers sharing
# the GPU, 4 servers on its cores; by default 1,700 steps of 128 windows per worker: 111 M tokens per method
# (10 per parameter, where the VM's longest run took 9.8 M) and 17 outer rounds. Synchronous push_pull and
# DiLoCo H = 100 in one run; each method's result lands in the .json as it ends, so a run the time limit
# stops keeps the ones done. STEPS, BATCH, LR, METHODS and TIMEOUT override the defaults.
# The model comes from transformers: a bare offline machine needs its wheels (and their dependencies, for
# the machine's Python) in .whl, which scripts/device-env.sh installs.
# Run: run(command="bash scripts/device-diloco.sh", carry=[".whl"]); the page lands under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pushpull-device}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source scripts/device-env.sh
if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "device-diloco: no CUDA device here; nothing to run"; exit 0
fi
if ! python3 -c 'import transformers' 2>/dev/null; then
  echo "device-diloco: transformers is not importable (carry its wheels in .whl)"; exit 1
fi
nvidia-smi -L 2>/dev/null; nproc
STEPS=${STEPS:-1700}; BATCH=${BATCH:-128}; LR=${LR:-0.0003}
METHODS=${METHODS:-sync@$LR,diloco100@lr=$LR}
timeout "${TIMEOUT:-540}" python3 benchmarks/diloco_quality.py --device cuda --workers 4 --servers 4 \
  --steps "$STEPS" --batch "$BATCH" --lr "$LR" --schedule constant --precision bf16 \
  --n-embd 384 --n-layer 6 --n-head 6 --eval-every 100 --methods "$METHODS" \
  --out "$OUT/diloco_quality_10m_gpu.md" 2>&1 | tail -40
