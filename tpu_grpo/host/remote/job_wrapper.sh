# A job's run.sh (written by start_job.sh): runs command.sh detached, its output the job's log; on success records
# the step as done (a copy of job.json named $2 in folder $3, when $2 is given); then records the exit code.
dir=$1; record=$2; done_dir=$3
cd ~
echo $$ > "$dir/pid"
bash "$dir/command.sh" > "$dir/log" 2>&1 < /dev/null
code=$?
if [ "$code" = 0 ] && [ -n "$record" ]; then mkdir -p "$done_dir" && cp "$dir/job.json" "$done_dir/$record"; fi
echo "$code" > "$dir/exit_code.tmp" && mv "$dir/exit_code.tmp" "$dir/exit_code"
