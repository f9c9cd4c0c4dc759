"""What the TPU is doing, for `invoke status`: each chip's HBM in use and total and its duty cycle,
read on the host with tpu-info's Python API (`tpu_info.device`, `tpu_info.metrics`; tpu-info comes
with MaxText's tpu-post-train extra), not by parsing its tables. Its runtime metrics exist only
while a workload holds the TPU (libtpu serves them on localhost:8431)."""

from __future__ import annotations

import json

from tpu_grpo.config import host_paths
from tpu_grpo.host import facts, remote

GIB = 1 << 30


def parse(answer: facts.Answer) -> dict:
    lines = answer.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (answer.stderr or answer.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"tpu-info failed on the host (exit {answer.exited}): {tail[0]}"}


class Chips(facts.Fact):
    """The chips as tpu-info sees them: {"chip", "chips", "owners", "usage": [{device, hbm_used, hbm_total,
    duty_cycle_pct}]}, or {"error"}."""

    script = staticmethod(lambda: remote.run("chips", python=f"{host_paths.VENV}/bin/python"))
    parse = staticmethod(parse)


def summary(found: dict) -> str:
    """One line for the status: the chips, and who holds them."""
    if "error" in found:
        return f"TPU: {found['error']}"
    if not found.get("chips"):
        return "TPU: tpu-info sees no TPU chips on this host"
    held = (
        f"held by pid {', '.join(map(str, found['owners']))}"
        if found["owners"]
        else "idle (no process holds them; runtime metrics exist only while a workload runs)"
    )
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
        table.add_row(
            str(chip["device"]),
            f"{chip['hbm_used'] / GIB:.2f} GiB",
            f"{chip['hbm_total'] / GIB:.2f} GiB",
            f"{share:.0f}%",
            f"{chip['duty_cycle_pct']:.1f}%",
        )
    console.print(table)
