#!/bin/sh
# Slurm epilog: the job's GPU energy (J) since the prolog, per GPU and in total, appended as one
# line of JSON to $ZEUS_JOB_LOG (default /var/log/zeus-slurm/jobs.jsonl). See the prolog.
set -u
exporter="${ZEUS_EXPORTER:-http://127.0.0.1:9400}"
dir="${ZEUS_JOB_DIR:-/var/lib/zeus-slurm}"
log="${ZEUS_JOB_LOG:-/var/log/zeus-slurm/jobs.jsonl}"
job="${SLURM_JOB_ID:?SLURM_JOB_ID is not set}"
case "$job" in *[!0-9_]*) echo "zeus epilog: odd SLURM_JOB_ID '$job'" >&2; exit 0 ;; esac
start="$dir/$job.start"
if [ ! -f "$start" ]; then
    echo "zeus epilog: no start record for job $job" >&2
    exit 0
fi
if ! metrics="$(curl -fsS --max-time 5 "$exporter/metrics")"; then
    echo "zeus epilog: cannot read $exporter/metrics; job $job gets no energy record" >&2
    rm -f "$start"
    exit 0
fi
umask 022
mkdir -p "$(dirname "$log")" || exit 0
printf '%s\n' "$metrics" | awk -v job="$job" -v startfile="$start" -v now="$(date +%s)" '
    BEGIN { while ((getline line < startfile) > 0) { split(line, f, " "); s[f[1]] = f[2] } }
    /^zeus_gpu_energy_joules_total\{/ {
        if (match($0, /gpu="[0-9]+"/) == 0) next
        g = substr($0, RSTART + 5, RLENGTH - 6)
        if (g in s) { e[g] = $NF - s[g] }
    }
    END {
        out = ""; total = 0
        for (g in e) { out = out sprintf("%s\"%s\": %.3f", (out == "" ? "" : ", "), g, e[g]); total += e[g] }
        printf "{\"job\": \"%s\", \"end\": %d, \"gpu_energy_j\": {%s}, \"total_gpu_energy_j\": %.3f}\n", job, now, out, total
    }' >> "$log"
rm -f "$start"
exit 0
