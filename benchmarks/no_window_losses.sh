#!/bin/bash
# TCP losses on the emulated hosts with and without the engine's window: the how_useful cell (VGG16, 8 MB,
# 4 workers with colocated servers, 200 Mbit/s, compute/comm 0.25) run once as wfbp+lw (the default window)
# and once as partition_only (unlimited credit), one job each, while every host's TCP counters are read
# from inside its network namespace once a second (nstat, absolute, history untouched). Prints each run's
# step time and, per host, the segments sent, retransmitted, retransmission timeouts and tail-loss probes
# at the end of its job (the job's probes before its timed steps included: the same in both runs).
#
#   flock /tmp/pushpull-cpu.lock bash benchmarks/no_window_losses.sh      # ~1 minute, needs root (namespaces)
#
# The grid asks for cubic on every host (as the stored grids ran); a VM that does not let namespaces select
# it keeps its default (each host's line says which ran). To allow it for the run and put it back after:
#   flock /tmp/pushpull-cpu.lock bash -c 'old=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control);
#     sysctl -qw net.ipv4.tcp_allowed_congestion_control="$old cubic"; bash benchmarks/no_window_losses.sh;
#     sysctl -qw net.ipv4.tcp_allowed_congestion_control="$old"'
#
# Why: the simulator's fluid links cannot make partition_only slower than 1.5 M/B on colocated servers
# (docs/results/simulator.md, validation); this shows what the wire does instead.
set -euo pipefail
tmp=$(mktemp -d)
trap 'kill $sampler 2>/dev/null || true; rm -rf "$tmp"' EXIT
for s in wfbp+lw partition_only; do
  cat > "$tmp/$s.json" <<EOF
{"name": "no_window_$s", "models": ["vgg16"], "strategies": ["$s"],
 "variants": {"partition_only": {"base": "bytescheduler+lw", "credit_bytes": "inf"}},
 "backends": ["ps"], "workers": [4], "bandwidths": ["200mbit"], "ratios": [0.25],
 "grad_mb": 8, "tries": 2, "steps": 3, "warmup": 2, "repeats": 1}
EOF
done
(while true; do
   for ns in $(ip netns list | awk '{print $1}'); do
     echo "$(date +%s.%N) $ns $(ip netns exec "$ns" nstat -asz TcpOutSegs TcpRetransSegs TcpExtTCPTimeouts \
                                 TcpExtTCPLossProbes 2>/dev/null | awk 'NR>1{printf "%s=%s ", $1, $2}')" \
          "cc=$(ip netns exec "$ns" cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null)"
   done
   sleep 1
 done) > "$tmp/samples" 2>/dev/null &
sampler=$!
for s in wfbp+lw partition_only; do
  t0=$(date +%s.%N)
  python -m pushpull bench grid "$tmp/$s.json" --out "$tmp/$s.jsonl" > "$tmp/$s.log" 2>&1 || { cat "$tmp/$s.log"; exit 1; }
  t1=$(date +%s.%N)
  echo "$s $t0 $t1" >> "$tmp/runs"
done
sleep 1
python - "$tmp" <<'EOF'
import json, sys
tmp = sys.argv[1]
runs = [l.split() for l in open(f"{tmp}/runs")]
last = {}
for line in open(f"{tmp}/samples"):
    p = line.split()
    if len(p) < 3:
        continue
    t, ns, kv = float(p[0]), p[1], dict(x.split("=") for x in p[2:])
    for name, a, b in runs:
        # a host of this run's cluster: seen during the run, and it sent something (the next run's
        # cluster may already exist, with fresh counters, when this one's last sample is taken)
        if float(a) <= t <= float(b) and not ns.endswith("-sw") and int(kv.get("TcpOutSegs", 0)) > 0:
            cc = kv.get("cc") or last.get((name, ns), {}).get("cc")   # a sample can miss it: keep the last seen
            last[(name, ns)] = dict(kv, cc=cc)
for name, _, _ in runs:
    r = json.loads(open(f"{tmp}/{name}.jsonl").readline())
    print(f"{name}: step {r['step_s'] * 1e3:.0f} ms (tries {', '.join(f'{x * 1e3:.0f}' for x in r['try_step_s'])})")
    for (n, ns), kv in sorted(last.items()):
        if n == name:
            print(f"  {ns} ({kv.get('cc')}): sent {kv.get('TcpOutSegs')} segments, retransmitted "
                  f"{kv.get('TcpRetransSegs')}, timeouts {kv.get('TcpExtTCPTimeouts')}, tail-loss probes "
                  f"{kv.get('TcpExtTCPLossProbes')}")
EOF
