"""Stand-in of tpu-info's Python API (tpu-info 0.14.2: `tpu_info.device`, `tpu_info.metrics`), for the
test host, where no TPU is. See ../README.md."""
