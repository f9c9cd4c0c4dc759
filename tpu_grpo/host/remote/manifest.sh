# A folder's absolute path, its SUMS (as saved, else hashed now) and each file's size, for a fetch
# (host/artifacts.py's _manifest). Inputs, set before this text by tpu_grpo.host.remote.shell: FOLDER (may begin
# with `~`), SUMS, MISSING_EXIT; after sums.sh.
set -euo pipefail
cd "$(at "$FOLDER")" 2>/dev/null && [ -n "$(find . -type f ! -path "./$SUMS" -print -quit)" ] || exit "$MISSING_EXIT"
pwd -P
if [ -f "$SUMS" ]; then cat "$SUMS"; else hash_all; fi
echo --sizes
find . -type f ! -path "./$SUMS" -printf '%s %P\n'
