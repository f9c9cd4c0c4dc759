"""The playbook's one-round-trip check script run for real, its `become` checks through sudo on this machine."""

from __future__ import annotations

import subprocess

from tests.support import write_book
from tpu_grpo.provision import engine, playbook

# ---------------------------------------------------------------- the round trip and the checks, run for real


def test_gather_script_runs_every_check_once_and_reports_codes_and_output(tmp_path):
    book = playbook.load(
        write_book(
            tmp_path,
            """\
        prelude: |
          set -euo pipefail
          greet() { echo "hello from $(id -un)"; }
        steps:
          - name: passes
            check: greet
            run: 'true'
          - name: fails with output
            check: echo "it's not there" >&2; exit 3
            run: 'true'
          - name: skipped
            when: [never]
            check: exit 9
            run: 'true'
          - name: stops at its first failing line
            check: |
              echo first
              false
              echo not reached
            run: 'true'
          - name: as root
            become: true
            check: greet; [ "$(id -u)" = 0 ]
            run: 'true'
          - name: as root, failing
            become: true
            check: '[ "$(id -u)" != 0 ]'
            run: 'true'
        vars:
          never: {default: false}
        """,
        )
    )
    values = playbook.resolve(book)
    planned = engine.plan(book, values)
    script = engine.gather_script(planned)
    assert script.count("sudo ") == 1  # one sudo for every `become` check: sudo costs as much as a check
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    # the output of a failing check only: it says why in `--check`, and a passing check's is never shown
    assert engine.parse_gathered(done.stdout) == {
        0: (0, ""),
        1: (3, "it's not there"),
        3: (1, "first"),
        4: (0, ""),
        5: (1, ""),
    }
