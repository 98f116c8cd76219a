#!/usr/bin/env bash
# A one-node Slurm on this machine for tests/cluster/test_slurm.py (Debian's slurm-wlm and munge; root).
#   bash scripts/slurm-local.sh start   # munged, slurmctld, slurmd with a minimal slurm.conf; waits until idle
#   bash scripts/slurm-local.sh stop
# Exits non-zero, saying why, when it cannot (no slurm-wlm, not root): the test then skips with that reason.
set -euo pipefail
conf_dir=/etc/slurm
host=$(hostname -s)
cpus=$(nproc)
case "${1:-start}" in
  start)
    # a Slurm that already answers (a real cluster, or an earlier start) is used as it is: never reconfigured
    if sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc"; then echo "slurm-local: using the running Slurm"; exit 0; fi
    [ "$(id -u)" = 0 ] || { echo "slurm-local: needs root" >&2; exit 3; }
    if [ -e "$conf_dir/slurm.conf" ] && ! grep -q "^# pushpull slurm-local" "$conf_dir/slurm.conf"; then
      echo "slurm-local: $conf_dir/slurm.conf exists and is not ours; not touching it" >&2; exit 3
    fi
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
      || { echo "slurm-local: slurm-wlm / munge not installed (apt-get install slurm-wlm)" >&2; exit 3; }
    mkdir -p "$conf_dir" /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge
    [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || su -s /bin/sh munge -c "munged" || munged --force
    cat > "$conf_dir/slurm.conf" <<CONF
# pushpull slurm-local (scripts/slurm-local.sh): a one-node test cluster
ClusterName=pushpull
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmUser=root
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MpiDefault=none
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true  # a node drained by an earlier config
    for _ in $(seq 1 60); do
      if sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc"; then echo "slurm-local: up ($host)"; exit 0; fi
      sleep 0.5
    done
    echo "slurm-local: the node did not come up:"; sinfo 2>&1 | tail -3; tail -n 5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log 2>&1
    exit 4 ;;
  stop)
    grep -q "^# pushpull slurm-local" "$conf_dir/slurm.conf" 2>/dev/null || { echo "slurm-local: not ours"; exit 0; }
    pkill -x slurmd || true; pkill -x slurmctld || true ;;
esac
