"""Showing a provisioning run: a line per finished step as it happens, what each host is doing
right now, and a summary per host with what failed and why.
"""

from __future__ import annotations

import threading
import time

from tpu_grpo.config.printing import styled
from tpu_grpo.provision.engine import OUTPUT_TAIL_LINES, Report, StepResult

STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "skipped": "dim"}


class LiveView:
    """Prints a line per finished step as it happens, and what each host is doing right now."""

    def __init__(self, console, check_mode: bool):
        from rich.live import Live

        self.console, self.check_mode = console, check_mode
        self.running: dict[str, tuple[str, float, str]] = {}
        self.lock = threading.Lock()
        self.live = Live(console=console, refresh_per_second=4, transient=True, get_renderable=self._now)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def _now(self):
        from rich.text import Text

        lines = [
            f"{host}  {step}  {time.monotonic() - since:.0f}s  {last[-100:]}"
            for host, (step, since, last) in sorted(self.running.items())
        ]
        return Text("\n".join(lines), style="cyan")

    def __call__(self, kind: str, host: str, step: str, payload) -> None:
        with self.lock:
            if kind == "start":
                self.running[host] = (step, time.monotonic(), "")
            elif kind == "output" and host in self.running:
                self.running[host] = (*self.running[host][:2], payload)
            elif kind == "done":
                self.running.pop(host, None)
                self.console.print(_step_line(host, payload, self.check_mode), soft_wrap=True)


def _step_line(host: str, result: StepResult, check_mode: bool):
    label = "would change" if check_mode and result.status == "changed" else result.status
    seconds = f"{result.seconds:6.1f}s" if result.seconds else " " * 7
    note = f"  ({result.note})" if result.note and result.note != "would change" else ""
    return styled(
        "{}  [" + STATUS_STYLE[result.status] + "]{}[/] {}  {}{}", host, f"{label:<12}", seconds, result.step, note
    )


def print_summary(report: Report, console) -> None:
    """After the step lines: what failed and why, and one summary line per host."""
    for host in report.hosts:
        for notice in host.notices:
            console.print(f"note: {notice}", soft_wrap=True)
        for result in host.steps:
            if result.status == "failed" or (report.check_mode and result.output):
                verb = "would change" if report.check_mode else "failed"
                heading = f"{host.host}: '{result.step}' {verb}" + (
                    f" with exit code {result.exit_code}" if result.exit_code else ""
                )
                note = (
                    "" if result.note in {"", f"exit code {result.exit_code}", "would change"} else f": {result.note}"
                )
                console.print(styled("[bold]{}[/]{}", heading, note), soft_wrap=True)
                for line in result.output.splitlines()[-OUTPUT_TAIL_LINES:]:
                    console.print(f"    {line}", soft_wrap=True)
    for host in report.hosts:
        counts = host.counts()
        summary = ", ".join(
            f"{count} {'would change' if report.check_mode and status == 'changed' else status}"
            for status, count in counts.items()
        )
        state = "[bold red]FAILED[/]" if host.failed else "[green]done[/]"
        console.print(
            styled("{}: " + state + "  {}" + ("  [red]{}[/]" if host.error else ""), host.host, summary, host.error)
        )
