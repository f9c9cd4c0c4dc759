"""Every `fix:` the program prints runs as pasted, with its placeholders filled: a setting's fix, run in a throwaway
checkout against the Pulumi CLI's double (tests/doubles/pulumi: `config set`, `--path`, `config rm`), mends what it
names, and following fixes one after another ends in settings that parse, never back at a refusal seen before (a
circle). A flag's fix: test_cli_safety's refusal table (tests.support.pasteable).

The fixes of the settings come from each key given values of every kind (text with a space, numbers out of range, a
list, a mapping, a bucket's name in capitals, ...), and from the refusals only several keys together make (a slice's
store, a bucket asked of the disk store, a failover place at fault)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import ROOT
from tests.support import fix_commands as commands
from tpu_grpo.config import settings
from tpu_grpo.config.errors import SettingsError
from tpu_grpo.config.keys import KEYS

KINDS_OF_VALUES = ["x y", "-1", "0", "Bad!", ["a"], {"a": 1}, "999999999", "true", "gs://Bad_Name/runs"]
#: Refusals of several keys together: (what the stack file adds, the key refused).
TOGETHER = [
    ({"tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "true"}, "tpu-grpo:checkpointStore"),
    ({"tpu-grpo:bucket": "true"}, "tpu-grpo:bucket"),
    ({"tpu-grpo:capacity": "spot", "tpu-grpo:reservation": None, "tpu-grpo:checkpointStore": "shm"}, None),
    (
        {
            "tpu-grpo:fallback": [
                {"zone": "us-east5-a"},
                {"zone": "us-east1-d", "capacity": "spot"},
                {"zone": "us-central2-b", "capacity": "bogus"},
            ]
        },
        "tpu-grpo:fallback",
    ),
    ({"tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "false"}, "tpu-grpo:usePathways"),
]


def checkout(tmp_path: Path, config: dict, key_file: Path) -> Path:
    folder = tmp_path / "checkout"
    folder.mkdir()
    shutil.copy(ROOT / "Pulumi.yaml", folder)
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))
    shutil.copy(key_file, folder / "YOUR_KEY.pub")
    return folder


def refusal(folder: Path) -> SettingsError | None:
    raw = yaml.safe_load((folder / "Pulumi.dev.yaml").read_text())["config"]
    try:
        settings.parse({key: value for key, value in raw.items() if value is not None}, "dev", folder)
    except SettingsError as error:
        return error
    return None


def follow(folder: Path, cli: PulumiCli) -> list[str]:
    """Pastes the first command of each fix the stack's refusal prints, until it parses: the refusals met."""
    met: list[str] = []
    for _ in range(6):
        error = refusal(folder)
        if error is None:
            return met
        said = f"{error.key}: {error.problem}"
        assert said not in met, f"the fixes go in a circle: {met + [said]}"
        met.append(said)
        pasted = commands(error.fix)
        assert pasted, f"no command in the fix of {error}"
        ran = subprocess.run(
            ["bash", "-c", pasted[0]], cwd=folder, env=cli.env(), capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0, f"{pasted[0]!r} (the fix of {error}) exited {ran.returncode}: {ran.stderr}"
    raise AssertionError(f"six fixes and still refused: {met}")


def refused_settings(stack_values: dict, root: Path) -> dict[str, tuple[dict, str]]:
    """Each fix the settings print, with a stack file that prints it."""
    found: dict[str, tuple[dict, str]] = {}
    cases = [({key.name: value}, key.name) for key in KEYS for value in KINDS_OF_VALUES] + TOGETHER
    for change, _ in cases:
        config = {**stack_values, **change}
        try:
            settings.parse({key: value for key, value in config.items() if value is not None}, "dev", root)
        except SettingsError as error:
            found.setdefault(error.fix, (config, error.key))
    return found


def test_every_settings_fix_runs_as_pasted_and_mends_without_a_circle(stack_values, tmp_path):
    key_file = Path(stack_values["tpu-grpo:sshPublicKeyPath"])
    fixes = refused_settings(stack_values, tmp_path)
    assert len(fixes) > 40  # every key's own, and those of several keys together
    for number, (fix, (config, _)) in enumerate(sorted(fixes.items())):
        for command in commands(fix):  # each alternative is a command line bash reads
            assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command
        case = tmp_path / str(number)
        case.mkdir()
        config = {**config, "tpu-grpo:sshPublicKeyPath": "YOUR_KEY.pub"}
        folder = checkout(case, config, key_file)
        follow(folder, PulumiCli(case / "cloud"))


@pytest.mark.parametrize(
    "fix, expected",
    [
        ("pulumi config set gcp:project YOUR_PROJECT_ID", ["pulumi config set gcp:project grpo-lab-123"]),
        (
            "ssh-keygen -t ed25519 -f /k/id, or pulumi config set tpu-grpo:sshPublicKeyPath YOUR_KEY.pub",
            ["ssh-keygen -t ed25519 -f /k/id", "pulumi config set tpu-grpo:sshPublicKeyPath YOUR_KEY.pub"],
        ),
        (
            "pulumi config set tpu-grpo:checkpointStore gs://YOUR_BUCKET/runs (or pulumi config rm tpu-grpo:bucket)",
            ["pulumi config set tpu-grpo:checkpointStore gs://grpo-runs/runs", "pulumi config rm tpu-grpo:bucket"],
        ),
        ("free it (rm -rf /dev/shm/OLD) or pass --need-gb", []),
    ],
)
def test_the_commands_of_a_fix_are_read_as_a_user_reads_them(fix, expected):
    assert commands(fix) == expected
