#!/usr/bin/env bash
# A single-node SLURM cluster on 127.0.0.1, for CI and for trying the slurm profile
# on a workstation:
#
#   sudo bash scripts/slurm_cluster.sh start     # install (if missing), configure, start
#   bash scripts/slurm_cluster.sh status         # daemons, node, queue
#   sudo bash scripts/slurm_cluster.sh stop      # stop the daemons (by PID), remove the state
#
# What it runs: munged (its own socket and key), slurmctld and slurmd, all as root,
# from Debian's `slurm-wlm` and `munge` (apt-get install -y when missing). No
# slurmdbd: the profile polls with squeue (slurm-status-command: squeue), which
# needs finished jobs to stay visible to squeue, hence MinJobAge=600.
# The node gets this machine's CPUs and memory and a fake GPU (Gres=gpu:N with
# File=/dev/null), so rules with a `gpu` resource are submitted and scheduled.
#
# The config must be /etc/slurm/slurm.conf: the plugin's job step drops SLURM_CONF
# from the environment of the inner srun. The script refuses to overwrite a
# slurm.conf it did not write. Everything else lives under $MWM_SLURM_STATE
# (default /tmp/mwm-slurm): state, spool, logs, PID files, the munge key and socket.
#
# Environment: MWM_SLURM_STATE (state folder), MWM_SLURM_GPUS (fake GPUs on the
# node, default 1), MWM_SLURM_MIN_JOB_AGE (seconds, default 600).
set -euo pipefail

STATE=${MWM_SLURM_STATE:-/tmp/mwm-slurm}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
GRES_CONF=$CONF_DIR/gres.conf
MARK="# written by mwm scripts/slurm_cluster.sh"
GPUS=${MWM_SLURM_GPUS:-1}
MIN_JOB_AGE=${MWM_SLURM_MIN_JOB_AGE:-600}
NODE=localhost
PARTITION=debug

log() { echo "slurm_cluster: $*" >&2; }

pid_alive() {  # pid_alive FILE: the PID in FILE is a running process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    log "installing slurm-wlm munge (missing: ${missing[*]})"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        slurm-wlm munge >"$STATE/apt.log" 2>&1; then
        # stale package lists: update once and retry
        apt-get update -q >>"$STATE/apt.log" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            slurm-wlm munge >>"$STATE/apt.log" 2>&1 || { cat "$STATE/apt.log" >&2; return 1; }
    fi
}

write_config() {
    if [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
        log "$CONF exists and was not written by this script; not touching it"
        return 1
    fi
    local cpus mem
    cpus=$(nproc)
    # a little below MemTotal: slurmd drains a node that reports less than RealMemory
    mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.95)}' /proc/meminfo)
    mkdir -p "$CONF_DIR"
    cat >"$CONF.tmp" <<EOF
$MARK
# single-node test cluster on 127.0.0.1; state under $STATE
ClusterName=mwm
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
# finished jobs stay visible to squeue this long (the plugin polls with squeue)
MinJobAge=$MIN_JOB_AGE
KillWait=5
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$cpus RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    {
        echo "$MARK"
        for ((i = 0; i < GPUS; i++)); do
            echo "NodeName=$NODE Name=gpu File=/dev/null"
        done
    } >"$GRES_CONF.tmp"
    mv "$CONF.tmp" "$CONF"
    mv "$GRES_CONF.tmp" "$GRES_CONF"
}

start_munged() {
    pid_alive "$STATE/munged.pid" && return 0
    mkdir -p "$STATE/munge"
    chmod 0700 "$STATE/munge"
    if [[ ! -s $STATE/munge/munge.key ]]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$STATE/munge/munge.key"
    fi
    munged --force --socket="$STATE/munge/munge.socket" --key-file="$STATE/munge/munge.key" \
        --pid-file="$STATE/munged.pid" --log-file="$STATE/munged.log" \
        --seed-file="$STATE/munge/munged.seed"
}

wait_until() {  # wait_until SECONDS CMD...: poll every 0.1 s
    local end=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.1
    done
}

node_ready() {
    [[ $(sinfo -h -n "$NODE" -o %t 2>/dev/null) =~ ^(idle|mix|alloc)$ ]]
}

start() {
    if [[ $(id -u) -ne 0 ]]; then
        log "start needs root (daemons run as root, config goes to $CONF)"
        return 1
    fi
    mkdir -p "$STATE"
    chmod 0755 "$STATE"
    install_packages
    if pid_alive "$STATE/slurmctld.pid" && pid_alive "$STATE/slurmd.pid" && node_ready; then
        log "already running (state: $STATE)"
        return 0
    fi
    write_config
    mkdir -p "$STATE/ctld" "$STATE/spool"
    start_munged
    if ! pid_alive "$STATE/slurmctld.pid"; then
        # -c: start from a clean state (no jobs of an earlier cluster), -i: ignore state errors
        slurmctld -c -i
    fi
    wait_until 20 scontrol ping || { log "slurmctld did not answer"; tail -20 "$STATE/slurmctld.log" >&2; return 1; }
    if ! pid_alive "$STATE/slurmd.pid"; then
        slurmd -N "$NODE"
    fi
    if ! wait_until 30 node_ready; then
        scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
        wait_until 10 node_ready || {
            log "node $NODE not ready"; sinfo -N -l >&2 || true; tail -20 "$STATE/slurmd.log" >&2; return 1; }
    fi
    log "up: node $NODE ($(nproc) CPUs, gpu:$GPUS), partition $PARTITION, MinJobAge=$MIN_JOB_AGE, state $STATE"
}

stop_pid() {  # stop_pid NAME: TERM the daemon in $STATE/NAME.pid, KILL after 10 s
    local file=$STATE/$1.pid pid
    pid_alive "$file" || { rm -f "$file"; return 0; }
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$1 ($pid) did not stop on TERM; killing"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

stop() {
    if [[ ! -d $STATE ]]; then
        log "not running (no $STATE)"
        return 0
    fi
    if pid_alive "$STATE/slurmctld.pid"; then
        # cancel what is still queued or running, so no slurmstepd outlives the cluster
        scancel --user="$(id -un)" 2>/dev/null || true
    fi
    stop_pid slurmd
    stop_pid slurmctld
    stop_pid munged
    if [[ -e $CONF ]] && grep -qF "$MARK" "$CONF"; then
        rm -f "$CONF" "$GRES_CONF"
    fi
    rm -rf "$STATE"
    log "stopped"
}

status() {
    local rc=0 d
    for d in munged slurmctld slurmd; do
        if pid_alive "$STATE/$d.pid"; then
            echo "$d: running (pid $(cat "$STATE/$d.pid"))"
        else
            echo "$d: not running"
            rc=1
        fi
    done
    if [[ $rc -eq 0 ]]; then
        sinfo -N -o "%N %P %t %c %m %G" || rc=1
        squeue -o "%i %j %T %M %R" || rc=1
    fi
    return $rc
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    restart) stop; start ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; echo "usage: $0 start|stop|status|restart" ;;
    *) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
