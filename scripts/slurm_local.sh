#!/usr/bin/env bash
# A real, single-node SLURM cluster on localhost, for tests (pytest -m slurm) and for trying
# the SLURM launchers (conf/hydra/launcher/slurm_*.yaml) without a cluster.
#
#   bash scripts/slurm_local.sh up      # install (Debian: slurm-wlm, munge) when missing, start
#   bash scripts/slurm_local.sh status  # sinfo
#   bash scripts/slurm_local.sh down    # cancel every job, stop the daemons
#
# Needs root and Debian's package registry (apt-get) the first time (~35 s: slurm-wlm, munge,
# slurmdbd, mariadb-server): it writes /etc/slurm and /etc/munge. The cluster: one node named
# after this host with all its CPUs and 90% of its memory, one partition `debug` (default, no
# time limit), munge authentication with a locally generated key, slurmctld + slurmd on this
# machine, proctrack/linuxproc and task/none (no cgroups: they are not available in
# containers), KillWait=5 s so a cancelled job dies fast. Accounting goes through slurmdbd into
# a local MariaDB: submitit learns that a job died (cancelled, killed, node failure) from
# `sacct`; without accounting a killed job stays "UNKNOWN" and the sweep waits for it forever.
# State lives in /var/spool/slurm-local and logs in /var/log/slurm-local.
set -euo pipefail

STATE=/var/spool/slurm-local
LOGS=/var/log/slurm-local
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "slurm_local.sh: run as root (it installs packages and starts daemons)" >&2
        exit 1
    fi
}

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null && command -v sbatch >/dev/null \
        && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge slurmdbd mariadb-server >/dev/null
}

write_config() {
    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$LOGS"
    cat >"$CONF" <<EOF
# written by scripts/slurm_local.sh: single-node test cluster
ClusterName=mtad-local
SlurmctldHost=$NODE
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    cat >/etc/slurm/slurmdbd.conf <<EOF
# written by scripts/slurm_local.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$STATE/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
EOF
    chmod 600 /etc/slurm/slurmdbd.conf
}

start_accounting() {
    if ! mysqladmin ping >/dev/null 2>&1; then
        mkdir -p /run/mysqld
        chown mysql:mysql /run/mysqld 2>/dev/null || true
        (mysqld_safe >/dev/null 2>&1 &)
        for _ in $(seq 100); do mysqladmin ping >/dev/null 2>&1 && break; sleep 0.2; done
    fi
    mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    alive "$STATE/slurmdbd.pid" || slurmdbd
    for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx mtad-local; then
        sacctmgr -i add cluster mtad-local >/dev/null
    fi
}

start_munge() {
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    if ! munge -n >/dev/null 2>&1; then
        if id munge >/dev/null 2>&1; then
            runuser -u munge -- munged --force
        else
            munged --force
        fi
    fi
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && return; sleep 0.1; done
    echo "slurm_local.sh: munged did not start" >&2
    exit 1
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
    need_root
    install
    write_config
    start_munge
    start_accounting
    alive "$STATE/slurmctld.pid" || slurmctld -c -f "$CONF"
    alive "$STATE/slurmd.pid" || slurmd -f "$CONF"
    for _ in $(seq 120); do
        state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
        case "$state" in
            idle* | mix* | alloc*) echo "slurm_local: $NODE $state"; return ;;
            down* | drain*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    echo "slurm_local.sh: node $NODE did not come up; see $LOGS" >&2
    sinfo >&2 || true
    exit 1
}

down() {
    need_root
    if command -v scancel >/dev/null; then scancel --full --quiet --user=root 2>/dev/null || true; fi
    for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/slurmdbd.pid"; do
        if alive "$pidfile"; then
            pid=$(cat "$pidfile")
            kill "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
    done
    echo "slurm_local: stopped (munged and mariadb left running)"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) sinfo ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
