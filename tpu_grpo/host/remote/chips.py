"""Print the TPU chips as tpu-info sees them, one JSON object (the chips fact reads it): tpu-info's Python API
(`tpu_info.device`, `tpu_info.metrics`), whose runtime metrics exist only while a workload holds the TPU."""

import json


def chips() -> dict:
    try:
        from tpu_info import device, metrics
    except ImportError:
        return {"error": "tpu-info is not in the venv; fix: uv run invoke provision"}
    chip_type, count = device.get_local_chips()
    owners = sorted(set(device.get_chip_owners().values()))
    found: dict = {"chip": chip_type.value.name if chip_type else None, "chips": count, "owners": owners, "usage": []}
    if chip_type and owners:
        try:
            found["usage"] = [
                {
                    "device": u.device_id,
                    "hbm_used": u.memory_usage,
                    "hbm_total": u.total_memory,
                    "duty_cycle_pct": u.duty_cycle_pct,
                }
                for u in metrics.get_chip_usage(chip_type)
            ]
        except Exception as error:  # the runtime's metrics server does not answer (a workload starting or ending)
            found["unavailable"] = type(error).__name__
    return found


if __name__ == "__main__":
    print(json.dumps(chips()))
