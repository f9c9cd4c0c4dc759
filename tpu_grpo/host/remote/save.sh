# Copy folder SRC to DEST via DEST.partial, with the SUMS (SHA256SUMS) of the source, hashed while the copy runs,
# that the copy is then checked against; a no-op when DEST already holds files that match its SUMS, unless REPLACE
# is true. Hashing and checking use every core (host/artifacts.py's save_script). Inputs, set before this text by
# tpu_grpo.host.remote.shell: SRC and DEST (each may begin with `~`, neither ends with `/`), REPLACE (true or false), SUMS,
# MISSING_EXIT; after sums.sh.
set -euo pipefail
src=$(at "$SRC")
dest=$(at "$DEST")
part="$dest.partial"
if [ "$REPLACE" != true ] && [ -f "$dest/$SUMS" ] && check_sums "$dest"; then
  echo "already saved: $dest (checksums verified)"; exit 0
fi
if [ ! -d "$src" ] || [ -z "$(find "$src/" -type f -print -quit)" ]; then
  echo "nothing to save: $src is missing or has no files; fix: export the model there first" >&2
  exit "$MISSING_EXIT"
fi
mkdir -p "$(dirname "$dest")"
rm -rf "$part" "$part.sums"
mkdir "$part"
cp -a "$src/." "$part/" & copying=$!
(cd "$src" && hash_all) > "$part.sums"
wait "$copying" || {
  echo "copying $src to $part failed; fix: free space on its disk (df -h), then run again" >&2; exit 1; }
chmod -R u+w "$part"
mv "$part.sums" "$part/$SUMS"
check_sums "$part" || { echo "the copy in $part does not match $src's checksums; fix: run again" >&2; exit 1; }
rm -rf "$dest"
mv "$part" "$dest"
sync -f "$dest"
echo "saved: $src -> $dest ($(wc -l < "$dest/$SUMS") files, checksums verified)"
