# The function every script tpu_grpo.host.remote.shell sends has before its own text (its inputs may be paths on
# the host that begin with `~`): a path as given, with its leading ~ as the home.
at() { printf '%s' "${1/#\~/$HOME}"; }
