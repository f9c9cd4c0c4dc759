"""What the TPU is doing, for `invoke status`: each chip's HBM in use and total and its duty cycle,
read on the host with tpu-info's Python API (`tpu_info.device`, `tpu_info.metrics`; tpu-info comes
with MaxText's tpu-post-train extra), not by parsing its tables. Its runtime metrics exist only
while a workload holds the TPU (libtpu serves them on localhost:8431)."""

from __future__ import annotations

import json

from tpu_grpo import facts, host_paths

GIB = 1 << 30

#: Runs on the host in the MaxText venv; prints one JSON object.
PROGRAM = """
import json
try:
    from tpu_info import device, metrics
except ImportError:
    print(json.dumps({"error": "tpu-info is not in the venv; fix: uv run invoke provision"}))
    raise SystemExit
chip_type, count = device.get_local_chips()
owners = sorted(set(device.get_chip_owners().values()))
found = {"chip": chip_type.value.name if chip_type else None, "chips": count, "owners": owners, "usage": []}
if chip_type and owners:
    try:
        found["usage"] = [{"device": u.device_id, "hbm_used": u.memory_usage, "hbm_total": u.total_memory,
                           "duty_cycle_pct": u.duty_cycle_pct} for u in metrics.get_chip_usage(chip_type)]
    except Exception as error:  # the runtime's metrics server does not answer (a workload starting or ending)
        found["unavailable"] = type(error).__name__
print(json.dumps(found))
"""


def parse(answer: facts.Answer) -> dict:
    lines = answer.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (answer.stderr or answer.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"tpu-info failed on the host (exit {answer.exited}): {tail[0]}"}


#: The chips as tpu-info sees them: {"chip", "chips", "owners", "usage": [{device, hbm_used, hbm_total,
#: duty_cycle_pct}]}, or {"error"}.
CHIPS = facts.Fact("chips", lambda: f"{host_paths.VENV}/bin/python - <<'TPU_GRPO_CHIPS'\n{PROGRAM}\nTPU_GRPO_CHIPS",
                   parse)


def summary(found: dict) -> str:
    """One line for the status: the chips, and who holds them."""
    if "error" in found:
        return f"TPU: {found['error']}"
    if not found.get("chips"):
        return "TPU: tpu-info sees no TPU chips on this host"
    held = (f"held by pid {', '.join(map(str, found['owners']))}" if found["owners"]
            else "idle (no process holds them; runtime metrics exist only while a workload runs)")
    return f"TPU: {found['chips']} {found['chip']} chips, {held}"


def show(console, found: dict) -> None:
    """The summary line, then a row per chip while a workload gives runtime metrics."""
    from rich.table import Table

    console.print(summary(found))
    if found.get("unavailable"):
        console.print(f"  no runtime metrics yet ({found['unavailable']}): the workload is starting or ending")
    if not found.get("usage"):
        return
    table = Table(title="TPU chips (tpu-info)", title_justify="left")
    for column in ("chip", "HBM used", "HBM total", "HBM %", "duty cycle"):
        table.add_column(column, justify="right")
    for chip in found["usage"]:
        share = 100 * chip["hbm_used"] / chip["hbm_total"] if chip["hbm_total"] else 0
        table.add_row(str(chip["device"]), f"{chip['hbm_used'] / GIB:.2f} GiB", f"{chip['hbm_total'] / GIB:.2f} GiB",
                      f"{share:.0f}%", f"{chip['duty_cycle_pct']:.1f}%")
    console.print(table)
