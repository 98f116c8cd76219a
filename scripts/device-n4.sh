#!/usr/bin/env bash
# One call on a lent 16-core machine: why n = 4 workers and k = 4 servers on hosts of their own sit near
# 100 ms a step at both 10 and 25 Gbit/s (line_rate_16cores_s15, bounds 64 and 26 ms).
#   1. pushpull bench wire over veth, n = k = 4, auth none and auto: CPU-seconds per GB for each role
#      beside gloo's ranks and a raw TCP stream (is a process CPU-bound per byte with cores to spare?);
#   2. the grid's 25 Gbit/s n = 4 cell with the engine's fitted key (1 MiB at k = 4) and with BytePS's
#      4,096,000 bytes, none and auto, beside the ring of the same run.
# Everything lands under $OUT. Run: run(command="bash scripts/device-n4.sh", carry=[".whl", ".ipr"]).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pushpull-device}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source scripts/device-env.sh
{ echo "== machine"; nproc; uname -r; command -v ip tc; } 2>&1 | tee "$OUT/machine.txt"
if [ "${SKIP_WIRE:-0}" != 1 ]; then echo "== bench wire, veth, n = k = 4"
timeout "${WIRE_TIMEOUT:-120}" python3 -m pushpull bench wire --transports veth --auth none,auto --workers 4 \
  --servers 4 --gb 0.5 --json "$OUT/wire_16cores_n4.jsonl" 2>&1 | tee "$OUT/wire_16cores_n4.txt" | tail -30; fi
echo "== grid: n = 4, 25 Gbit/s, key sizes"
python3 - <<'PYEOF'
import json
from pushpull.bench.grid_spec import load_config
cfg = load_config("benchmarks/configs/line_rate_16cores.json")
cfg.update(name="line_rate_16cores_n4_keys", workers=[4], bandwidths=["25gbit"], placements=["separate"], tries=4)
json.dump(cfg, open("/tmp/n4_engine.json", "w"))                     # the fitted key, and the ring
json.dump(dict(cfg, backends=["ps"], ps_partition_bytes=[4096000]), open("/tmp/n4_4mb.json", "w"))
PYEOF
if [ -n "${ALTERNATE:-}" ]; then   # ALTERNATE=N: the two key sizes N times each, one after the other, auth none
  python3 - <<'PYEOF'
import json
for f in ("/tmp/n4_engine.json", "/tmp/n4_4mb.json"):
    cfg = json.load(open(f)); cfg.update(backends=["ps"], auth=["none"]); json.dump(cfg, open(f, "w"))
PYEOF
  for i in $(seq "$ALTERNATE"); do for c in /tmp/n4_engine.json /tmp/n4_4mb.json; do
    timeout "${GRID_TIMEOUT:-110}" python3 -m pushpull bench grid --no-progress --out "$OUT/n4_keys_alt$i.jsonl" \
      --log-dir /tmp/grid-logs "$c" 2>&1 | tail -1
  done; cat "$OUT/n4_keys_alt$i.jsonl" >> "$OUT/line_rate_16cores_n4_keys.jsonl"; done
else
  for c in /tmp/n4_engine.json /tmp/n4_4mb.json; do
    timeout "${GRID_TIMEOUT:-110}" python3 -m pushpull bench grid --no-progress --out "$OUT/line_rate_16cores_n4_keys.jsonl" \
      --log-dir /tmp/grid-logs "$c" 2>&1 | tail -2
  done
fi
python3 - "$OUT/line_rate_16cores_n4_keys.jsonl" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["backend"], r["auth"], r.get("engine_partition_bytes"), f"{r['step_s'] * 1e3:.0f} ms",
          f"comm {r['t_comm_s'] * 1e3:.0f} ms", [round(t * 1e3) for t in r["try_step_s"]])
PYEOF
