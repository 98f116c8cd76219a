#!/usr/bin/env bash
# One call on a lent GPU machine (16 cores): what this 2-core VM cannot show, in the order that matters.
#   1. scripts/gpu-check.sh: CUDA tensors through every path;
#   2. the line-rate grid on 16 cores (benchmarks/configs/line_rate_16cores.json), its n = 4 cells first.
# The machine is bare and offline: wheels the image lacks travel in .whl, iproute2 (ip, tc) in .ipr when the
# image has none. Everything lands under $OUT (logs, the grid's jsonl). Each part has its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pushpull-device}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source scripts/device-env.sh
{ echo "== machine"; nproc; uname -r; free -g | head -2; command -v ip tc; } 2>&1 | tee "$OUT/machine.txt"
if [ "${SKIP_GPU_CHECK:-0}" != 1 ]; then echo "== gpu-check"
GPU_CHECK_TIMEOUT=${GPU_CHECK_TIMEOUT:-200} bash scripts/gpu-check.sh 2>&1 | tee "$OUT/gpu-check.log" | tail -25; fi
echo "== emulated cluster"
timeout 60 python3 -m pushpull cluster check 2>&1 | tee "$OUT/cluster-check.txt"
CFG=benchmarks/configs/line_rate_16cores.json
python3 - "$CFG" <<'PYEOF'
import json, sys
from pushpull.bench.grid_spec import load_config
cfg = load_config(sys.argv[1]); cfg["workers"] = [4]
json.dump(cfg, open("/tmp/line_rate_16cores_n4.json", "w"))
PYEOF
for c in /tmp/line_rate_16cores_n4.json "$CFG"; do
  echo "== grid $c"
  timeout "${GRID_TIMEOUT:-330}" python3 -m pushpull bench grid --no-progress --out "$OUT/line_rate_16cores.jsonl" \
    --log-dir /tmp/grid-logs "$c" 2>&1 | tail -8
done
tar czf "$OUT/grid-logs.tgz" -C /tmp grid-logs 2>/dev/null
python3 -m pushpull bench report --out-dir "$OUT" "$OUT/line_rate_16cores.jsonl" 2>&1 | tail -3
sed -n '/PS against/,/Scale/p' "$OUT/line_rate_16cores.md"
