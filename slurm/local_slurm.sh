#!/usr/bin/env bash
# A Slurm cluster of two nodes, n1 and n2, on this machine: to try the batch scripts and the sweep's
# --executor slurm on a laptop, and what the tests run against. Debian's packages, as root:
#
#   apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server
#   slurm/local_slurm.sh start [DIR]    # then: export SLURM_CONF=DIR/slurm.conf
#   slurm/local_slurm.sh stop [DIR]
#
# Both nodes are slurmd processes of this host (slurmd -N), their names resolving to 127.0.0.1 (a line
# in /etc/hosts), each saying it has 8 CPUs (or this machine's, if more). Its state, logs and
# accounting database (slurmdbd on MariaDB, for sacct: submitit reads job states there) live in DIR
# (default /tmp/ppo-vec-slurm); without slurmdbd or mariadb-server it keeps no accounting. It listens
# on ports 16801-16819 of 127.0.0.1.
set -euo pipefail
action=${1:-start}
dir=$(realpath -m "${2:-/tmp/ppo-vec-slurm}")
export SLURM_CONF=$dir/slurm.conf

stop() {  # every daemon of DIR (munged if this script started it), by its pid file; the ports are free once they are gone
  local pids=()
  for file in "$dir"/*.pid; do
    [ -f "$file" ] && pids+=("$(cat "$file")")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

case "$action" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "$0: needs root (the daemons run as root here)" >&2; exit 1; }
for command in slurmctld slurmd munged sbatch; do
  command -v "$command" >/dev/null || {
    echo "$0: $command is missing: apt-get install slurmctld slurmd slurm-client munge" >&2
    exit 1
  }
done
stop
rm -rf "$dir"
mkdir -p "$dir/state" "$dir/spool"
grep -qw n1 /etc/hosts || echo "127.0.0.1 n1 n2" >>/etc/hosts

# munge authenticates every message (its key came with the package)
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- munged
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$dir/munged.pid"  # started here: stop ends it too
fi

accounting=none
command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && accounting=slurmdbd
cpus=$(( $(nproc) > 8 ? $(nproc) : 8 ))  # 8 at least, as a node says (config_overrides): the batch scripts' asks fit
cat >"$SLURM_CONF" <<CONF
ClusterName=ppovec
# job ids go on from the last start's, not from 1: a run folder is named by its job's id (--run-id)
FirstJobId=$(($(date +%s) % 60000000 + 1))
SlurmctldHost=$(hostname)
SlurmctldPort=16817
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/$accounting
AccountingStorageHost=localhost
AccountingStoragePort=16819
KillWait=30
NodeName=n1 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=16801 CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=16802 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF

if [ "$accounting" = slurmdbd ]; then
  mariadb-install-db --datadir="$dir/db" --user=root >"$dir/mariadb-install.log" 2>&1
  setsid mariadbd --datadir="$dir/db" --user=root --socket="$dir/mysql.sock" --bind-address=127.0.0.1 \
    --port=16806 --pid-file="$dir/mariadb.pid" --log-error="$dir/mariadb.log" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do mariadb --socket="$dir/mysql.sock" -e "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
  mariadb --socket="$dir/mysql.sock" -e "create user 'slurm'@'localhost' identified by 'slurm';
    grant all on slurm_acct_db.* to 'slurm'@'localhost'; create database slurm_acct_db;"
  cat >"$dir/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdPort=16819
SlurmUser=root
LogFile=$dir/slurmdbd.log
PidFile=$dir/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=16806
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$dir/slurmdbd.conf"
  slurmdbd
  for _ in $(seq 50); do timeout 5 sacctmgr -i add cluster ppovec >/dev/null 2>&1 && break; sleep 0.2; done
  timeout 5 sacctmgr -n list cluster format=cluster 2>/dev/null | grep -q ppovec ||
    { echo "local_slurm.sh: slurmdbd does not answer: see $dir/slurmdbd.log" >&2; exit 1; }
fi
slurmctld
slurmd -N n1
slurmd -N n2
for _ in $(seq 150); do
  [ "$(sinfo -h -o %t 2>/dev/null | sort -u)" = idle ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "$0: the nodes did not come up within 30 s; see $dir/*.log" >&2
exit 1
