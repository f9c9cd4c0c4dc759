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


#: Raw YAML a person (or a paste) puts where a stack file's key goes: names of settings, in this project's namespace
#: misspelt, in none, in another; YAML's own tags and complex keys; names that are environment variables.
RAW_KEYS = st.sampled_from(
    [
        *(key.name for key in KEYS[:12]),
        "tpu-grpo:zone",
        "tpu_grpo:model",
        "TPU-GRPO:batches",
        "capacity",
        "gcp:region",
        "tpu-grpo:hfToken",
        "tpu-grpo:sshKey",
        "aws:region",
        "!!int 123",
        "!!binary aGk=",
        "? [a, b]\n   ",
        "'quoted:key'",
        '"tpu-grpo:\\u2010batches"',
    ]
)
#: Raw YAML values: plain and quoted text, numbers, tags, flow collections, anchors and aliases, deep nesting.
RAW_VALUES = st.one_of(
    st.sampled_from(
        [
            "x",
            "''",
            "~",
            "12",
            "-1",
            "1e309",
            ".nan",
            "true",
            "yes",
            "!!str 5",
            "!!float 5",
            "!!python/object:os.system ['id']",
            "[a, b]",
            "{a: b}",
            "&x [1, 2]",
            "*x",
            "*nosuch",
            "[" * 200 + "]" * 200,
            "'" + "a" * 3000 + "'",
            '"\\u2010"',
            "|\n    two\n    lines",
            "us\u2010east5-b",
            "hf_" + "t" * 30,
        ]
    ),
    HOSTILE.map(lambda text: yaml.safe_dump(text, default_style='"').strip()),
)


@st.composite
def raw_stack_files(draw, config: dict):
    """A stack file written as text: the good stack's lines, some replaced or added as raw YAML, and aliases above."""
    lines = [f"  {line}" for line in yaml.safe_dump(config).splitlines()]
    for _ in range(draw(st.integers(1, 3))):
        line = f"  {draw(RAW_KEYS)}: {draw(RAW_VALUES)}"
        lines.insert(draw(st.integers(0, len(lines))), line)
    head = draw(st.sampled_from(["", "anchors: &x [1, 2]\n", "a: &a [x, x]\nb: [*a, *a, *a]\n"]))
    return head + "config:\n" + "\n".join(lines) + "\n"


def wrongly_accepted(text: str) -> str | None:
    """An oracle that does not use the project's parser: what a stack file the settings took must not hold. A key
    that is text in a namespace, and not this project's (misspelt or not) unless it is one of its settings; gcp:
    keys the provider reads (pulumi-gcp's gcp:region, gcp:credentials, ...) are the provider's to judge."""
    try:
        config = (yaml.safe_load(text) or {}).get("config") or {}
    except (yaml.YAMLError, RecursionError, AttributeError):
        return "YAML PyYAML refuses (or no mapping) was taken"
    known = {key.name for key in KEYS}
    for name in config:
        if not isinstance(name, str) or ":" not in name:
            return f"key {name!r} (no namespace, or not text) was taken"
        namespace = name.split(":", 1)[0].lower().replace("_", "-")
        if namespace == "tpu-grpo" and name not in known:  # gcp: holds the provider's own keys (gcp:region) too
            return f"key {name!r} of no setting was taken"
    return None


@hypothesis_settings(
    max_examples=EXAMPLES // 10 or 150,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_a_stack_file_written_as_raw_text_keeps_the_contract_and_no_wrong_acceptance(project, data):
    """Tags, complex keys, deep nesting, aliases and misnamed keys, as text no yaml.safe_dump writes: `settings`
    exits 0 or 2 in one line (never a traceback, never the token), and what it takes, the oracle takes too."""
    folder, config, listener = project
    text = data.draw(raw_stack_files(config))
    (folder / "Pulumi.fuzz.yaml").write_text(text)
    argv = ["settings", "--stack", "fuzz"]
    result = invoke(*argv, cwd=folder, env={"HF_TOKEN": TEST_TOKEN, "HOME": str(folder.parent)})
    check_contract([*argv, text], result, listener.accepted, listener)
    assert "hf_" + "t" * 30 not in result.stderr  # a token-like value under a key that means the token
    if result.returncode == 0:
        assert wrongly_accepted(text) is None, (text, wrongly_accepted(text))


#: Raw YAML for a playbook's parts: each of its keys given a value of every kind.
RAW_PLAYBOOK_PARTS = st.fixed_dictionaries(
    {
        "vars": st.sampled_from(["{who: {default: a}}", "[a]", "3", "{who: {default: a, pattern: '[a-'}}",
                                 "{who: {default: a, choices: 5}}", "{1: {default: a}}", "{who: a}"]),
        "steps": st.sampled_from(["[{name: s, check: 'false', run: 'true'}]", "3", "[[a]]", "[{name: [s]}]",
                                  "[{name: s, check: 5, run: x}]", "[{name: s, check: x, run: x, when: x}]", "{}"]),
        "prelude": st.sampled_from(["''", "[a]", "'echo {{ nosuch }}'", "5"]),
    }
)  # fmt: skip
#: What the laptop's records and environment may hold: a damaged record, a state folder, a stack name, a kubeconfig.
RAW_RECORDS = st.sampled_from(
    ['{"dir": "' + "x" * 300 + '"}', '{"dir": 12}', '{"dir": "a\\u0000b"}', "[1]", "not json", '{"url": 5}', ""]
)


@hypothesis_settings(
    max_examples=EXAMPLES // 10 or 60,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(parts=RAW_PLAYBOOK_PARTS, record=RAW_RECORDS, stack=HOSTILE_RELATIVE, kubeconfig=RAW_VALUES)
def test_a_playbook_records_and_an_environment_written_as_raw_text_keep_the_contract(
    project, parts, record, stack, kubeconfig
):
    """A user's own playbook, a damaged record on the laptop, TPU_GRPO_STACK and TPU_GRPO_KUBECONFIG of any text:
    one line and exit 2 (or the answer), never a traceback, never a connection before a refusal."""
    folder, _, listener = project
    (folder / "book.yml").write_text("".join(f"{key}: {value}\n" for key, value in parts.items()))
    state = folder / ".tpu-grpo-raw"
    for kind in ("fetched", "published"):
        (state / kind).mkdir(parents=True, exist_ok=True)
        (state / kind / "r.json").write_text(record)
    (folder / "kubeconfig").write_text(kubeconfig)
    env = {
        "HF_TOKEN": TEST_TOKEN,
        "HOME": str(folder.parent),
        "TPU_GRPO_STATE": str(state),
        "TPU_GRPO_STACK": stack,
        "TPU_GRPO_KUBECONFIG": str(folder / "kubeconfig"),
    }
    host = ["--host", f"nobody@127.0.0.1:{listener.port}", "--wait", "0"]
    for argv in (["provision", "--playbook", "book.yml", *host], ["runs", "--json", *host], ["settings"]):
        result = invoke(*argv, cwd=folder, env=env)
        check_contract(argv, result, listener.accepted, listener)
