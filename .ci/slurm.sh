#!/usr/bin/env bash
# Install Slurm (Debian's slurm-wlm), configure a cluster of two "nodes" on this one machine (two slurmd
# daemons, pp-node1 and pp-node2, NodeAddr 127.0.0.1, distinct ports; Slurm's multiple-slurmd mode), start
# munge, slurmctld and the slurmds, wait until sinfo shows both nodes idle, and print the partition's name
# on stdout (the Makefile's test target exports it as PIPEPLAN_TEST_SLURM). Everything else goes to stderr.
# Run as root. Idempotent: a running cluster with its nodes idle is reused; a slurm.conf that this script
# did not write is left alone (the script then stops with an error).
# Set-up after https://slurm.schedmd.com/quickstart_admin.html and the slurm.conf man page (NodeHostname,
# Port: "multiple-slurmd" nodes on one host); no accounting daemon (sacct is then unavailable: the launcher
# falls back to `scontrol show job`).
set -euo pipefail
PARTITION=${PIPEPLAN_SLURM_PARTITION:-pipeplan}
CONF=/etc/slurm/slurm.conf
MARK="# written by pipeplan .ci/slurm.sh"
NODES="pp-node1 pp-node2"

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm) >&2
fi

idle() {  # both nodes answer and are idle
  [ "$(sinfo -h -p "$PARTITION" -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" -eq 2 ]
}

if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && idle; then
  echo "$PARTITION"
  exit 0
fi
if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  echo "error: $CONF exists and was not written by this script; not touching it" >&2
  exit 1
fi

HOST=$(hostname -s 2>/dev/null || cut -d. -f1 /proc/sys/kernel/hostname)
CPUS=$(nproc)
mkdir -p /etc/slurm /var/spool/slurmctld-pipeplan /var/log/slurm
cat > "$CONF" <<EOF
$MARK
ClusterName=pipeplan
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld-pipeplan
SlurmdSpoolDir=/var/spool/slurmd-pipeplan/%n
SlurmctldPidFile=/run/slurmctld-pipeplan.pid
SlurmdPidFile=/run/slurmd-pipeplan-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld-pipeplan.log
SlurmdLogFile=/var/log/slurm/slurmd-pipeplan-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=60
MinJobAge=600
KillWait=5
NodeName=pp-node1 NodeAddr=127.0.0.1 NodeHostname=$HOST Port=17001 CPUs=$CPUS RealMemory=1000 State=UNKNOWN
NodeName=pp-node2 NodeAddr=127.0.0.1 NodeHostname=$HOST Port=17002 CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=$PARTITION Nodes=pp-node[1-2] Default=YES MaxTime=INFINITE State=UP
EOF

# munge: the key comes with the package (made here if it did not); the daemon runs as the munge user
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged >&2
  for _ in $(seq 1 20); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
fi

# (re)start the daemons of this configuration
for pidf in /run/slurmctld-pipeplan.pid /run/slurmd-pipeplan-pp-node1.pid /run/slurmd-pipeplan-pp-node2.pid; do
  pid=$(cat "$pidf" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  fi
done
slurmctld -c -i >&2   # -c: a clean start (no saved jobs); -i: ignore state files it cannot recover
for n in $NODES; do
  mkdir -p "/var/spool/slurmd-pipeplan/$n"
  slurmd -N "$n" >&2
done

for _ in $(seq 1 60); do
  if idle; then
    sinfo -p "$PARTITION" -N >&2
    echo "$PARTITION"
    exit 0
  fi
  # nodes that came back after a restart may be marked down: return them to service
  scontrol update NodeName=pp-node[1-2] State=RESUME >/dev/null 2>&1 || true
  sleep 1
done
echo "error: the Slurm nodes did not become idle; sinfo says:" >&2
sinfo -N >&2 || true
tail -20 /var/log/slurm/slurmctld-pipeplan.log >&2 || true
exit 1
