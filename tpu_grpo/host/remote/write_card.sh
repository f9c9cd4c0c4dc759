# The model card beside a saved model, as README.md listed in its SHA256SUMS (results/publish.py's write_card).
# Inputs, set before this text by tpu_grpo.host.remote.shell: FOLDER (may begin with `~`), CARD (the card's text in
# base64) and SUMS (the checksum file's name).
set -euo pipefail
cd "$(at "$FOLDER")"
echo "$CARD" | base64 -d > README.md.tmp && mv README.md.tmp README.md
{ grep -v '  README.md$' "$SUMS" || true; sha256sum -- README.md; } | LC_ALL=C sort -k 2 > "$SUMS.tmp"
mv "$SUMS.tmp" "$SUMS"
