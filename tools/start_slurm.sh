#!/usr/bin/env bash
# Starts a one-node Slurm cluster on this machine for Tandem's Slurm test (tests:slurm_test):
# installs Slurm and munge from Debian's packages if missing, writes a munge key and a
# slurm.conf for this host, and starts munged, slurmctld and slurmd unless they already run.
# Idempotent. Needs root; without it (or without the packages) it says why and exits 1, and
# the Slurm test then skips with its reason.
set -uo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "start_slurm: needs root to install and start Slurm" >&2
  exit 1
fi
packages=(slurmd slurmctld slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "start_slurm: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null; } || {
    echo "start_slurm: could not install ${missing[*]}" >&2
    exit 1
  }
fi

host="$(hostname -s)"
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown munge:munge /run/munge
if ! grep -q "^NodeName=$host " /etc/slurm/slurm.conf 2>/dev/null; then
  cat >/etc/slurm/slurm.conf <<CONF
# One-node Slurm cluster on this build machine (for Tandem's Slurm test).
ClusterName=tandem
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=30
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
fi
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged || {
  echo "start_slurm: munged did not start" >&2
  exit 1
}
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 30); do
  if sinfo -h -o %T 2>/dev/null | grep -Eq '^(idle|mixed)'; then
    echo "start_slurm: Slurm is up on $host"
    exit 0
  fi
  scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1
  sleep 1
done
echo "start_slurm: Slurm did not come up: $(sinfo 2>&1 | tail -n 2)" >&2
exit 1
