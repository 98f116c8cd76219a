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
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if ! command -v tc >/dev/null 2>&1 && [ -d .ipr ]; then
  mkdir -p /tmp/ipr && for f in .ipr/*.deb; do dpkg -x "$f" /tmp/ipr; done
  for b in ip tc; do
    real=$(ls /tmp/ipr/{bin,sbin,usr/bin,usr/sbin}/$b 2>/dev/null | head -1)
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/ipr/lib/x86_64-linux-gnu:/tmp/ipr/usr/lib/x86_64-linux-gnu exec %s "$@"\n' "$real" \
      > /tmp/ipr/$b.sh && mv /tmp/ipr/$b.sh /tmp/ipr/wrap-$b
    chmod +x /tmp/ipr/wrap-$b
  done
  mkdir -p /tmp/iprbin && mv /tmp/ipr/wrap-ip /tmp/iprbin/ip && mv /tmp/ipr/wrap-tc /tmp/iprbin/tc
  export PATH="/tmp/iprbin:$PATH"
fi
{ echo "== machine"; nproc; uname -r; free -g | head -2; command -v ip tc; } 2>&1 | tee "$OUT/machine.txt"
if [ "${SKIP_GPU_CHECK:-0}" != 1 ]; then echo "== gpu-check"
GPU_CHECK_TIMEOUT=${GPU_CHECK_TIMEOUT:-200} bash scripts/gpu-check.sh 2>&1 | tee "$OUT/gpu-check.log" | tail -25; fi
echo "== emulated cluster"
timeout 60 python3 -m pushpull cluster check 2>&1 | tee "$OUT/cluster-check.txt"
CFG=benchmarks/configs/line_rate_16cores.json
python3 - "$CFG" <<'PYEOF'
import json, sys
from pushpull.bench.grid import load_config
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
