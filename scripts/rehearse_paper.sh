#!/usr/bin/env bash
# The paper's DAG rehearsed on CPU through the SLURM profile (mwm.workflow.rehearsal):
#
#   bash scripts/rehearse_paper.sh      # root or sudo: it starts scripts/slurm_cluster.sh
#
# Derives config/generated/paper-rehearsal.yaml from config/paper.yaml, runs
# `snakemake --profile slurm all` on it from scratch on the one-node cluster, and prints each stage's
# wall time and peak memory (also written to logs/paper-rehearsal/rehearsal.json).
set -euo pipefail
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
case ${1:-} in
    "") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "rehearse_paper.sh: unknown argument ${1} (it takes none)" >&2; usage >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
SUDO=
[[ $(id -u) -eq 0 ]] || SUDO="sudo -E"
if bash scripts/slurm_cluster.sh status >/dev/null 2>&1; then started=0; else started=1; fi
on_exit() { local rc=$?; [[ $started -eq 1 ]] && $SUDO bash scripts/slurm_cluster.sh stop || true; exit $rc; }
trap on_exit EXIT
$SUDO bash scripts/slurm_cluster.sh start

config=$(python -m mwm.workflow.rehearsal write)
start=$SECONDS
MWM_SLURM_PARTITION=debug snakemake --profile slurm --configfile "$config" --jobs 2 --latency-wait 10 \
    --slurm-init-seconds-before-status-checks 5 --seconds-between-status-checks 5 --forceall all
echo "rehearsal through the slurm profile: $((SECONDS - start)) s, $(date -u +%Y-%m-%d) on $(lscpu | sed -n 's/^Model name: *//p')"
python -m mwm.workflow.rehearsal record --out logs/paper-rehearsal/rehearsal.json
