#!/bin/sh
# Slurm prolog: remember each of the job's GPUs' cumulative energy (J) at the job's start, read
# from the node's zeus-monitor exporter (`zeus-monitor serve`, no driver call per read).
#
# slurm.conf:  Prolog=/etc/slurm/zeus-energy-prolog.sh
#              Epilog=/etc/slurm/zeus-energy-epilog.sh
# Settings (environment, or edit here):
#   ZEUS_EXPORTER  the exporter's address, default http://127.0.0.1:9400
#   ZEUS_JOB_DIR   where per-job start values are kept, default /var/lib/zeus-slurm
# A prolog must not fail a job for accounting: every error is logged and the job goes on.
set -u
exporter="${ZEUS_EXPORTER:-http://127.0.0.1:9400}"
dir="${ZEUS_JOB_DIR:-/var/lib/zeus-slurm}"
job="${SLURM_JOB_ID:?SLURM_JOB_ID is not set}"
case "$job" in *[!0-9_]*) echo "zeus prolog: odd SLURM_JOB_ID '$job'" >&2; exit 0 ;; esac
umask 077
mkdir -p "$dir" || exit 0
# The GPUs allocated to the job (SLURM_JOB_GPUS: comma-separated indices); all when unset.
gpus="${SLURM_JOB_GPUS:-}"
if ! metrics="$(curl -fsS --max-time 5 "$exporter/metrics")"; then
    echo "zeus prolog: cannot read $exporter/metrics; job $job gets no energy record" >&2
    exit 0
fi
printf '%s\n' "$metrics" | awk -v gpus="$gpus" '
    BEGIN { n = split(gpus, want, ","); for (i = 1; i <= n; i++) keep[want[i]] = 1 }
    /^zeus_gpu_energy_joules_total\{/ {
        if (match($0, /gpu="[0-9]+"/) == 0) next
        g = substr($0, RSTART + 5, RLENGTH - 6)
        if (n == 0 || (g in keep)) print g, $NF
    }' > "$dir/$job.start.tmp" && mv "$dir/$job.start.tmp" "$dir/$job.start"
exit 0
