# Start a job detached, under the TPU's lock (jobs/vm_jobs.py's start): refused while another job holds it
# (BUSY_EXIT, with the running job's id), and when the claimed file holds other text (CLAIMED_EXIT, with that
# text); prints the job's process group. Inputs, set before this text by tpu_grpo.host.remote.shell: JOBS, ROOT,
# TPU_LOCK and DONE (folders, each may begin with `~`), JOB_ID, COMMAND (the job's script), META (its job.json),
# WRAPPER (job_wrapper.sh's text), RECORD (the step record a success writes, or empty), CLAIM_PATH and CLAIM (a file
# to claim and its text in base64; CLAIM_PATH empty: none), BUSY_EXIT, CLAIMED_EXIT.
set -euo pipefail
jobs=$(at "$JOBS") root=$(at "$ROOT")
mkdir -p "$jobs"
exec 9>>"$(at "$TPU_LOCK")"
if ! flock -n 9; then echo "busy $(cat "$root/current" 2>/dev/null)"; exit "$BUSY_EXIT"; fi
if [ -n "$CLAIM_PATH" ]; then
  claim=$(at "$CLAIM_PATH")
  if [ -f "$claim" ]; then
    [ "$(base64 -w0 "$claim")" = "$CLAIM" ] || { echo "claimed $(base64 -w0 "$claim")"; exit "$CLAIMED_EXIT"; }
  else
    mkdir -p "$(dirname "$claim")" && echo "$CLAIM" | base64 -d > "$claim.tmp" && mv "$claim.tmp" "$claim"
  fi
fi
dir=$jobs/$JOB_ID
mkdir "$dir"
printf '%s' "$COMMAND" > "$dir/command.sh"
printf '%s' "$META" > "$dir/job.json"
printf '%s' "$WRAPPER" > "$dir/run.sh"
echo "$JOB_ID" > "$root/current"
setsid bash "$dir/run.sh" "$dir" "$RECORD" "$(at "$DONE")" < /dev/null > /dev/null 2>&1 &
for _ in $(seq 100); do [ -s "$dir/pid" ] && break; sleep 0.05; done
cat "$dir/pid"
