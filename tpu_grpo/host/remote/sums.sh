# Functions of the scripts that hash a folder (save.sh, manifest.sh), given SUMS (the checksum file's name) and
# sent before them by tpu_grpo.host.remote.shell.
hash_all() {  # every file below the current folder but SUMS, a file per core at once, sorted by path
  find . -type f ! -path "./$SUMS" -printf '%P\0' | xargs -0 -r -P "$(nproc)" -n 1 sha256sum -- | LC_ALL=C sort -k 2
}
check_sums() {  # `sha256sum -c --quiet SUMS` in folder $1, the files shared among the cores
  local cores i failed=0 pids=()
  cores=$(nproc)
  for i in $(seq 0 $((cores - 1))); do
    (cd "$1" && share=$(awk -v n="$cores" -v i="$i" 'NR % n == i' "$SUMS") && { [ -z "$share" ] ||
      printf '%s\n' "$share" | sha256sum -c --quiet - >/dev/null 2>&1; }) & pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || failed=1; done
  return $failed
}
