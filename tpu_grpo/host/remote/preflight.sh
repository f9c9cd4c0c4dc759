# Every check of the host before a run, each failing one printing `fail: what; fix: how` (jobs/pipeline.py's
# Preflight). Inputs, set before this text by tpu_grpo.host.remote.shell: VENV, MAXTEXT_VERSION, VERSION_PROGRAM,
# TOKEN_FILE (empty: the model is public, no token needed), SHM_KB, SHM_GB, DATA_ROOT, DATA_KB, MODELS, DOWNLOADED and DOWNLOAD_KB (the model provisioning
# downloads, and what the conversion downloads itself without it; DOWNLOADED empty: nothing to count), CHIPS and
# MACHINE_TYPE (CHIPS empty: the TPU's chips are not counted). Paths may begin with `~`, as the messages show them.
venv=$(at "$VENV")
[ -x "$venv/bin/python" ] || echo "fail: no MaxText venv at $VENV; fix: uv run invoke provision"
version=$("$venv/bin/python" -c "$VERSION_PROGRAM" 2>/dev/null) || version=none
[ "$version" = "$MAXTEXT_VERSION" ] ||
  echo "fail: MaxText in $VENV is $version, not $MAXTEXT_VERSION; fix: uv run invoke provision"
[ -z "$TOKEN_FILE" ] || [ -s "$(at "$TOKEN_FILE")" ] ||
  echo "fail: no Hugging Face token on the host; fix: HF_TOKEN=... uv run invoke provision --tags token"
free=$(df -Pk /dev/shm | awk 'NR==2 {print $4}')
[ "$free" -ge "$SHM_KB" ] || echo "fail: /dev/shm has $((free / 1048576)) GB free, a run needs $SHM_GB;" \
  "fix: free it (rm -rf /dev/shm/OLD) or pass --need-gb"
data=$(at "$DATA_ROOT")
mkdir -p "$data"
free=$(df -Pk "$data/" | awk 'NR==2 {print $4}') need=$DATA_KB
[ -z "$DOWNLOADED" ] || [ -f "$(at "$DOWNLOADED").complete" ] || need=$((need + DOWNLOAD_KB))
[ "$free" -ge "$need" ] || echo "fail: the data disk ($DATA_ROOT) has $((free / 1048576)) GB free, a run needs" \
  "$((need / 1048576)); fix: remove old models in $MODELS or grow dataDiskGb"
if [ -n "$CHIPS" ]; then
  chips=$("$venv/bin/python" -c "import jax; print(jax.device_count())" 2>/dev/null || echo none)
  [ "$chips" = "$CHIPS" ] || echo "fail: JAX sees $chips TPU chips, $MACHINE_TYPE has $CHIPS; fix: make sure no" \
    "other process holds the TPU (uv run invoke cancel), or check the machine type"
fi
