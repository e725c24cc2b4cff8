#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, to try `lra-train -m hydra/launcher=slurm` on a
# workstation and to test it in CI (tests/test_slurm.py).
#
#   sudo bash scripts/slurm_local.sh     # prints one line: whether SLURM is up
#
# Debian/Ubuntu, as root. Installs slurmctld, slurmd, slurm-client and munge where missing,
# writes /etc/slurm/slurm.conf for this host (its name, CPUs and memory; one partition
# "local"; no accounting, so `sacct` does not work: lra-train follows its jobs with
# `squeue`), and starts munged, slurmctld and slurmd directly (no systemd needed). Running it
# again on a running cluster changes nothing and prints the same line. Exits non-zero, with
# the reason, if SLURM does not come up. Logs: /var/log/slurm/. Stop it with
# `scontrol shutdown` (and `pkill -x munged` if you like).
#
# Settings for quick tests: a requeued job may start again after 30 s instead of 120 s
# (AuthInfo=cred_expire), finished jobs stay visible to squeue for 5 minutes (MinJobAge), and
# SlurmctldParameters=preempt_send_user_signal makes pre-emption send the warning signal.
# Time limits and their warning signal (sbatch --signal=USR2@S) are checked on slurmctld's
# fixed 30 s pass (PERIODIC_TIMEOUT, compiled in; no slurm.conf setting shortens it), so the
# signal comes up to 30 s after it is due: tests/test_slurm.py brings a job's limit forward
# with `scontrol update JobId=.. TimeLimit=..` and waits for one pass.
set -u

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}

fail() {
    echo "SLURM is NOT up: $*" >&2
    exit 1
}

# Whether a live (not zombie) process of this name runs.
alive() {
    local pid
    for pid in $(pgrep -x "$1"); do
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && return 0
    done
    return 1
}

node_state() { sinfo --noheader --node="$NODE" --format=%T 2>/dev/null | head -n1; }

up_line() {
    echo "SLURM is up: node $NODE ($CPUS CPUs, ${MEM_MB} MB) $(node_state) in partition local" \
        "(slurm $(sinfo --version 2>/dev/null | awk '{print $2}'))"
}

[ "$(id -u)" = 0 ] || fail "run me as root (sudo bash $0): I install packages and start daemons"

# 1. Packages.
missing=()
for pair in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] ||
        missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || fail "no apt-get to install ${missing[*]}: install SLURM yourself"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/tmp/slurm_local.apt.log 2>&1 &&
        apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/slurm_local.apt.log 2>&1 ||
        fail "apt-get install ${missing[*]} failed (log: /tmp/slurm_local.apt.log)"
fi
export PATH="$PATH:/usr/sbin:/sbin"

# 2. This host.
NODE=$(hostname -s)
CPUS=$(nproc --all)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
MEM_MB=$((MEM_MB * 9 / 10)) # leave some to the system; slurmd refuses a node that has less
getent hosts "$NODE" >/dev/null || fail "hostname $NODE does not resolve (add it to /etc/hosts)"

# Already up (and configured for this host)? Then nothing to do.
if [ -f "$CONF" ] && grep -q "^NodeName=$NODE " "$CONF" && alive slurmctld &&
    alive slurmd && alive munged; then
    case "$(node_state)" in
    idle* | mixed* | allocated* | completing*)
        up_line
        exit 0
        ;;
    esac
fi

# 3. Configuration.
mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/slurm
chown slurm:slurm "$LOG_DIR" /var/spool/slurmctld 2>/dev/null || true
cat >"$CONF.new" <<EOF
# Written by scripts/slurm_local.sh: a single-node cluster on $NODE.
ClusterName=lra-local
SlurmctldHost=$NODE
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again after 30 s (default 120 s).
AuthInfo=cred_expire=30
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# No cgroups (containers, no systemd): plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
# No accounting database: sacct does not work (lra-train falls back to squeue).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Jobs share the node by CPU and memory.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
# Requeue-friendly; finished jobs stay visible to squeue for 5 minutes.
JobRequeue=1
MinJobAge=300
KillWait=10
SlurmctldParameters=preempt_send_user_signal
SlurmdTimeout=60
InactiveLimit=0
NodeName=$NODE CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
if ! cmp -s "$CONF.new" "$CONF"; then
    mv "$CONF.new" "$CONF"
    changed=1
else
    rm -f "$CONF.new"
    changed=0
fi

# 4. Daemons: munge, then the controller, then the node daemon.
if ! alive munged; then
    [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; } ||
        fail "cannot create /etc/munge/munge.key"
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged --force 2>>"$LOG_DIR/munged.err" ||
        fail "munged does not start (see $LOG_DIR/munged.err)"
fi
munge -n | unmunge >/dev/null 2>&1 || fail "munge does not work (munge -n | unmunge)"

if [ "$changed" = 1 ]; then # a new configuration: restart what runs
    for d in slurmd slurmctld; do
        pid=$(cat "/run/slurm/$d.pid" 2>/dev/null) && kill "$pid" 2>/dev/null
    done
    for _ in $(seq 20); do
        alive slurmd || alive slurmctld || break
        sleep 0.5
    done
fi
if ! alive slurmctld; then
    /usr/sbin/slurmctld -i || fail "slurmctld does not start (see $LOG_DIR/slurmctld.log)"
fi
if ! alive slurmd; then
    /usr/sbin/slurmd || fail "slurmd does not start (see $LOG_DIR/slurmd.log)"
fi

# 5. Wait until the node takes jobs.
deadline=$((SECONDS + WAIT_S))
while :; do
    state=$(node_state)
    case "$state" in
    idle* | mixed* | allocated* | completing*) break ;;
    down* | drain*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 ;;
    esac
    if [ $SECONDS -ge $deadline ]; then
        fail "node $NODE is '${state:-not known to sinfo}' after ${WAIT_S}s" \
            "(logs: $LOG_DIR/slurmctld.log, $LOG_DIR/slurmd.log)"
    fi
    sleep 1
done
up_line
