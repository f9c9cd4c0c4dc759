"""Every flag of every task and every stack setting, given hostile values by a generator (Hypothesis), keeps the
command line's contract: exit 0, or 2 with one line naming the value and its fix (1 only for a failure on the
host, said in one line); never a traceback; the token never printed; nothing written outside the test's folders;
no connection when the exit is 2.

A fixed seed and budget here; a larger one with `TPU_GRPO_FUZZ_EXAMPLES=20000 uv run pytest tests/unit/test_fuzz.py`
(docs/development.md)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import tasks
from tests.support import ROOT, TEST_TOKEN, invoke
from tests.unit.test_cli_safety import Listener, write_events
from tpu_grpo.config import settings as settings_module
from tpu_grpo.config.errors import SettingsError
from tpu_grpo.config.keys import KEYS

EXAMPLES = int(os.environ.get("TPU_GRPO_FUZZ_EXAMPLES", "0"))
#: Flags a run of the generator must leave alone: they make a task serve, wait or act for real.
NOT_FUZZED = {"tensorboard": {"once"}, "logs": {"follow"}}
#: Each task's flags, from its body's signature (name -> takes no value), not from Invoke's get_arguments, which
#: pops the help texts it reads, leaving `--help` without them for the rest of the session.
TASKS = {
    name: [
        (flag, parameter.default is False)
        for flag, parameter in list(inspect.signature(tasks.ns.tasks[name].body).parameters.items())[1:]
        if flag not in NOT_FUZZED.get(name, set())
    ]
    for name in tasks.ns.task_names
}

#: What a person may type by mistake or on purpose: unicode digits and spaces, control characters, markup, shell
#: metacharacters, huge and empty values, long path components, odd hosts.
HOSTILE = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "0",
            "-1",
            "1.5",
            "١٢٠",
            "²",
            "1_0",
            "1e3",
            "nan",
            "inf",
            "9" * 5000,
            "0x10",
            "+5",
            "[/x]",
            "[bold]x[/bold]",
            "$(id)",
            "`id`",
            "a;b",
            "a b",
            "a\nb",
            "a\tb",
            "\x00",
            "\x1b[31m",
            "../../etc/passwd",
            "x" * 300,
            "a/" + "b" * 256,
            "u@10.0.0..5",
            "u@.a",
            f"u@{'a' * 64}.com",
            "u@[::1]",
            "u@h:99999",
            "a--b/c",
            "a/b.git",
            "gs://g00gle/x",
            "true",
            "False",
            "None",
            "~",
            "./",
            ".",
            "..",
            "café",
            "ünï",
            "'",
            '"',
            "\\",
            "%s",
            "{0}",
            "*",
            "?",
        ]
    ),
    st.text(min_size=0, max_size=40),
    st.text(alphabet=st.characters(categories=["Nd", "Zs", "Cc", "Sm", "Po"]), max_size=12),
)


def relative(value: str) -> bool:
    """A generated path stays in the test's folders: absolute paths and a home are what the user asked for."""
    return not value.startswith(("/", "~")) and "../.." not in value


HOSTILE_RELATIVE = HOSTILE.filter(relative)  # made once: a strategy made in each draw is validated in each draw


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz") / "project"
    folder.mkdir()
    key = folder.parent / "id_ed25519"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    config.update(
        {
            "gcp:project": "grpo-lab-123",
            "tpu-grpo:reservation": "v6e-8-calendar",
            "tpu-grpo:sshSourceRanges": ["203.0.113.7/32"],
            "tpu-grpo:sshPublicKeyPath": f"{key}.pub",
        }
    )
    (folder / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))
    write_events(folder / "events")
    listener = Listener()
    yield folder, config, listener
    listener.close()


def outside(folder: Path) -> dict[str, int]:
    """The checkout's files and the folder above the project, with their times: what a case may not touch."""
    return {
        str(path): path.lstat().st_mtime_ns
        for base in (ROOT, folder.parent.parent)
        for path in base.iterdir()
        if path.name not in {".pytest_cache", "__pycache__", ".mypy_cache"}
    }


def check_contract(argv: list[str], result, accepted_before: int, listener: Listener) -> None:
    said = result.stdout + result.stderr
    assert "Traceback" not in said, (argv, said[-2000:])
    assert TEST_TOKEN not in said, argv
    assert result.returncode in (0, 1, 2), (argv, result.returncode, said[-500:])
    lines = result.stderr.strip().splitlines()
    if result.returncode == 2:
        assert len(lines) == 1 and lines[0].startswith("error: ") and "fix" in lines[0], (argv, result.stderr)
        assert listener.accepted == accepted_before, (argv, "connected, then refused its input")
    if result.returncode == 1:  # a failure on the host: said in one line, or in provision's report (FAILED)
        reported = "FAILED" in result.stdout or '"failed": true' in result.stdout
        assert any(line.startswith("error: ") for line in lines) or reported, (argv, said[-500:])


@st.composite
def command_lines(draw):
    name = draw(st.sampled_from(sorted(TASKS)))
    chosen = draw(st.lists(st.sampled_from(TASKS[name]), min_size=1, max_size=3, unique_by=lambda flag: flag[0]))
    argv = [name]
    for name_, toggle in chosen:
        flag = "--" + name_.rstrip("_").replace("_", "-")
        if toggle:
            argv.append(flag)
            continue
        value = draw(HOSTILE_RELATIVE)
        argv += [flag, value]
    return argv


@hypothesis_settings(
    max_examples=EXAMPLES or 400,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(argv=command_lines())
def test_every_flag_of_every_task_keeps_the_contract(project, argv):
    folder, _, listener = project
    if "--host" not in argv and "--stack" not in argv:
        argv = [*argv, "--host", f"nobody@127.0.0.1:{listener.port}"]  # a host that answers TCP, then no SSH
    before, accepted = outside(folder), listener.accepted
    result = invoke(
        *argv,
        cwd=folder,
        env={"HF_TOKEN": TEST_TOKEN, "HOME": str(folder.parent), "TPU_GRPO_STATE": str(folder / ".tpu-grpo")},
    )
    check_contract(argv, result, accepted, listener)
    assert outside(folder) == before, argv


@hypothesis_settings(
    max_examples=EXAMPLES or 2000,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    key=st.sampled_from([key.name for key in KEYS]),
    value=st.one_of(
        HOSTILE,
        st.integers(),
        st.booleans(),
        st.lists(HOSTILE, max_size=3),
        st.dictionaries(HOSTILE, HOSTILE, max_size=2),
        st.just({"secure": "AAAB"}),
    ),
)
def test_every_setting_is_parsed_or_refused_in_one_line(project, key, value):
    folder, config, _ = project
    try:
        settings_module.parse({**config, key: value}, "dev", folder, lenient=True)
    except SettingsError as error:
        named = str(error).split("=", 1)[0]  # the key itself, or the key a rule between keys blames
        assert "\n" not in str(error) and named in {k.name for k in KEYS} and "; fix: " in str(error), str(error)


@hypothesis_settings(
    max_examples=EXAMPLES // 10 or 100,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(key=st.sampled_from([key.name for key in KEYS]), value=HOSTILE)
def test_every_setting_through_the_tasks_keeps_the_contract(project, key, value):
    folder, config, listener = project
    (folder / "Pulumi.fuzz.yaml").write_text(yaml.safe_dump({"config": {**config, key: value}}))
    for argv in (["settings", "--stack", "fuzz"], ["plan", "--stack", "fuzz"]):
        result = invoke(*argv, cwd=folder, env={"HF_TOKEN": TEST_TOKEN, "HOME": str(folder.parent)})
        check_contract(argv, result, listener.accepted, listener)
