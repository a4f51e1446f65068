#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for `make test-slurm` (and for trying the scripts by hand).
#
#   scripts/slurm/localcluster.sh install    apt-get install slurm-wlm and munge where they are missing (root)
#   scripts/slurm/localcluster.sh up DIR     write DIR/slurm.conf, start munged, slurmctld and slurmd, wait
#                                            until the node is idle; then: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm/localcluster.sh down DIR   stop the three daemons by their pid files in DIR
#
# Everything lives in DIR (conf, munge key and socket, spool, state, logs, pid files): nothing in /etc
# is changed and no service manager is needed. The node is this machine, with the CPUs `nproc` reports
# and the memory `slurmd -C` reports; processes are tracked without cgroups (proctrack/linuxproc,
# task/none) and there is no accounting (so no sacct: job states come from scontrol). Needs root
# (slurmd starts jobs as their user, munged runs as the munge user).
set -euo pipefail

die() {
  echo "localcluster.sh: $*" >&2
  exit 1
}

need_tools() {
  local missing=()
  for tool in munged slurmctld slurmd sbatch scontrol; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}; run: scripts/slurm/localcluster.sh install (as root)"
}

cmd_install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "slurm-wlm and munge are not installed and installing them needs root (apt-get)"
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get here"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; } ||
    die "apt-get install slurm-wlm munge failed"
}

free_port() {  # a TCP port nothing listens on now
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND until it succeeds
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

write_conf() {  # write_conf DIR
  local dir=$1 host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  [ -n "$mem" ] || die "slurmd -C reported no RealMemory"
  cat >"$dir/slurm.conf" <<EOF
# written by scripts/slurm/localcluster.sh: one node, no accounting, no cgroups
ClusterName=probe-local
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# finished jobs stay visible to scontrol for 10 minutes (there is no accounting to ask later)
MinJobAge=600
KillWait=5
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

cmd_up() {
  local dir=$1
  need_tools
  [ "$(id -u)" -eq 0 ] || die "starting slurmd needs root (it runs jobs as their user)"
  id munge >/dev/null 2>&1 || die "there is no munge user (install the munge package)"
  mkdir -p "$dir"/{munge,ctld,spool}
  dir=$(cd "$dir" && pwd)
  chmod 755 "$dir"
  [ ! -e "$dir/slurmctld.pid" ] || die "$dir already holds a cluster; run: $0 down $dir"
  write_conf "$dir"
  # munged: its own key (in a private folder), socket and state in DIR, as the munge user
  mkdir -p "$dir/munge/key"
  dd if=/dev/urandom of="$dir/munge/key/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$dir/munge"
  chmod 755 "$dir/munge"  # the socket's folder must be reachable by slurm and its clients
  chmod 700 "$dir/munge/key"
  chmod 400 "$dir/munge/key/munge.key"
  runuser -u munge -- munged --key-file="$dir/munge/key/munge.key" --socket="$dir/munge/munge.socket.2" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/key/munged.seed" ||
    die "munged did not start; see $dir/munge/munged.log"
  wait_for 20 "munge" munge --socket="$dir/munge/munge.socket.2" -n ||
    die "munged does not answer on $dir/munge/munge.socket.2; see $dir/munge/munged.log"
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -i || die "slurmctld did not start; see $dir/slurmctld.log"
  wait_for 30 "slurmctld" scontrol ping || die "slurmctld does not answer; see $dir/slurmctld.log"
  slurmd || die "slurmd did not start; see $dir/slurmd.log"
  local host
  host=$(hostname -s)
  wait_for 60 "node" node_idle "$host" ||
    die "node $host is not idle after 60 s ($(scontrol show node "$host" | grep -o 'State=[^ ]*'); see $dir/slurmd.log)"
  echo "slurm is up: export SLURM_CONF=$dir/slurm.conf   (stop it with: $0 down $dir)"
}

node_idle() {
  scontrol show node "$1" | grep -q 'State=IDLE'
}

stop_pidfile() {  # stop_pidfile FILE NAME: TERM the daemon the pid file names, wait, then KILL
  local file=$1 name=$2 pid
  [ -s "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait_for 20 "$name" not_running "$pid" || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

not_running() {
  ! kill -0 "$1" 2>/dev/null
}

cmd_down() {
  local dir=$1
  stop_pidfile "$dir/slurmd.pid" slurmd
  stop_pidfile "$dir/slurmctld.pid" slurmctld
  stop_pidfile "$dir/munge/munged.pid" munged
}

case ${1:-} in
  install) cmd_install ;;
  up) [ $# -eq 2 ] || die "usage: $0 up DIR"; cmd_up "$2" ;;
  down) [ $# -eq 2 ] || die "usage: $0 down DIR"; cmd_down "$2" ;;
  *) die "usage: $0 install | up DIR | down DIR" ;;
esac
