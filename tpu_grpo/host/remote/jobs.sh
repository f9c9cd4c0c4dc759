# Every job on the host, oldest first, a tab-separated line each: its folder, state, exit code, start, end, log's
# size and job.json in base64 (jobs/vm_jobs.py's Jobs). A job runs while its processes hold the TPU lock: after a
# reboot its old pid may be another process's. Inputs, set before this text by tpu_grpo.host.remote.shell: JOBS
# (the jobs' folder) and TPU_LOCK, each may begin with `~`.
lock=$(at "$TPU_LOCK")
held=; [ -e "$lock" ] && ! flock -n "$lock" true && held=1
cd "$(at "$JOBS")" 2>/dev/null || exit 0
for dir in $(ls -1 | sort); do
  [ -f "$dir/job.json" ] || continue
  pid=$(cat "$dir/pid" 2>/dev/null || echo 0)
  if [ -f "$dir/exit_code" ]; then state=finished; code=$(cat "$dir/exit_code"); finished=$(stat -c %Y "$dir/exit_code")
  elif [ -n "$held" ] && [ "$pid" != 0 ] && kill -0 -- "-$pid" 2>/dev/null; then state=running; code=; finished=
  else state=lost; code=; finished=; fi
  [ -f "$dir/cancelled" ] && state=cancelled
  size=$(stat -c %s "$dir/log" 2>/dev/null || echo 0)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$dir" "$state" "$code" "$(stat -c %Y "$dir/command.sh")" "$finished" \
    "$size" "$(base64 -w0 "$dir/job.json")"
done
