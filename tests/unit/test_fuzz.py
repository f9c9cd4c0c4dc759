"""Every flag of every task and every stack setting, given hostile values by a generator (Hypothesis), keeps the
command line's contract: exit 0, or 2 with one line (at most MAX_SAID characters and its cut) naming the value and
its fix (1 only for a failure on the host, said in one line); never a traceback; the token, a secret typed as one
and the SSH private key never printed; no connection and no file changed anywhere (the checkout, the test's home,
project and state folders) when the exit is 2. Settings drawn together, for each capacity and placement, make only
what Google's own rules take (an oracle written apart from the program's).

A fixed seed and budget here; a larger one with `TPU_GRPO_FUZZ_EXAMPLES=20000 uv run pytest tests/unit/test_fuzz.py`
(docs/development.md)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import tasks
from tests.support import ROOT, TEST_TOKEN, invoke
from tests.unit.test_cli_safety import Listener, write_events
from tpu_grpo.catalog.accelerators import MACHINES, MAX_SLICES, SLICES
from tpu_grpo.catalog.capacity import CAPACITIES
from tpu_grpo.config import settings as settings_module
from tpu_grpo.config.errors import SettingsError
from tpu_grpo.config.keys import KEYS
from tpu_grpo.config.secrets import MAX_SAID

EXAMPLES = int(os.environ.get("TPU_GRPO_FUZZ_EXAMPLES", "0"))
#: Flags a run of the generator must leave alone: they make a task serve, wait or act for real.
NOT_FUZZED = {"tensorboard": {"once"}, "logs": {"follow"}}
#: Each task's flags, from its flags record (name -> takes no value).
TASKS = {
    name: [
        (each.name, each.default is False)
        for each in dataclasses.fields(tasks.ns.tasks[name].flags)
        if each.name not in NOT_FUZZED.get(name, set())
    ]
    for name in tasks.ns.task_names
}
#: The longest refusal: "error: ", then conceal's line, cut past MAX_SAID with " … (N characters left out) … ".
LONGEST_REFUSAL = MAX_SAID + 60
#: A secret a person types where a secret goes (a password, another token), not the token in the environment: a
#: refusal never says it. Made anew in each session: Hypothesis types the strings of this file's source as text.
TYPED_SECRET = "pw" + secrets.token_hex(8)
#: The token and typed secrets as a person puts them in a value: whole, inside other text, as the value of a key whose
#: name says it is a secret (KEY=VALUE, KEY: VALUE, a mapping).
SECRET_FORMS = [
    TEST_TOKEN,
    f"x{TEST_TOKEN}y",
    f"HF_TOKEN={TEST_TOKEN}",
    f"train:HF_TOKEN={TEST_TOKEN}",
    f"HF_TOKEN={TYPED_SECRET}",
    f"hf_access_token={TYPED_SECRET}",
    f"train:hf_token={TYPED_SECRET}",
    f"Password={TYPED_SECRET}",
    f"api_secret: {TYPED_SECRET}",
    f"password: {TYPED_SECRET}",
    f"hf_token: {TYPED_SECRET}",
    f"PULUMI_CONFIG_PASSPHRASE={TYPED_SECRET}",
    f"{{'token': '{TYPED_SECRET}'}}",
]
SECRETS = st.sampled_from(SECRET_FORMS)

#: What a person may type by mistake or on purpose: unicode digits and spaces, control characters, markup, shell
#: metacharacters, huge and empty values, long path components, odd hosts, secrets.
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
    SECRETS,
)


def relative(value: str) -> bool:
    """A generated path stays in the test's folders: absolute paths and a home are what the user asked for."""
    return not value.startswith(("/", "~")) and "../.." not in value


HOSTILE_RELATIVE = HOSTILE.filter(relative)  # made once: a strategy made in each draw is validated in each draw
#: What an environment variable can hold: any text but a NUL, which no process's environment has.
HOSTILE_ENVIRONMENT = HOSTILE_RELATIVE.filter(lambda value: "\x00" not in value)
#: What the fuzzer's walks of a folder leave out: git's, the venv, and the caches Python, Hypothesis and pytest write.
UNWALKED = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
#: What another test of the unit tier writes into the checkout while this one runs beside it on another worker: the
#: README's plot, drawn by its command and put back (test_docs.py).
WRITTEN_BESIDE = {ROOT / "docs" / "metrics.png"}


def files(folder: Path) -> set[tuple[str, int | None, int | None]]:
    """Every path under `folder` (but UNWALKED and WRITTEN_BESIDE), a file with its size and modification time: what
    a refusal may not change. A folder is there or not: its time changes with entries of UNWALKED (a __pycache__)."""
    found: set[tuple[str, int | None, int | None]] = set()
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name in UNWALKED or Path(entry.path) in WRITTEN_BESIDE:
                continue
            if entry.is_dir(follow_symlinks=False):
                found.add((entry.path, None, None))
                found |= files(Path(entry.path))
            else:
                stat = entry.stat(follow_symlinks=False)
                found.add((entry.path, stat.st_size, stat.st_mtime_ns))
    return found


@dataclass
class Project:
    """The fuzzer's project folder (in a home of its own: its parent), the good stack's settings, a port that counts
    the connections made to it, a line of the SSH private key no output may hold, and the checkout's files as the
    last refusal left them (None: walk it again, a case that was no refusal ran since)."""

    folder: Path
    config: dict
    listener: Listener
    private_key: str
    checkout: set | None = field(default=None, init=False)

    @property
    def home(self) -> Path:
        return self.folder.parent

    @property
    def host(self) -> str:
        """A host that answers TCP, then no SSH."""
        return f"nobody@127.0.0.1:{self.listener.port}"

    def environment(self, **more: str) -> dict[str, str]:
        return {
            "HF_TOKEN": TEST_TOKEN,
            "HOME": str(self.home),
            "TPU_GRPO_STATE": str(self.folder / ".tpu-grpo"),
            **more,
        }


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz") / "project"
    folder.mkdir()
    key = folder.parent / "id_ed25519"
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
    sliced = {**config, "tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "true"}
    (folder / "Pulumi.slice.yaml").write_text(
        yaml.safe_dump({"config": {**sliced, "tpu-grpo:checkpointStore": "gs://fuzz-bucket/runs"}})
    )
    write_events(folder / "events")
    (folder.parent / "elsewhere").mkdir()
    (folder.parent / "elsewhere" / "a-file").write_text("not a folder\n")
    listener = Listener()
    seed = key.read_text().splitlines()[4][6:40]  # the ed25519 key's private half, which its .pub does not hold
    yield Project(folder, config, listener, seed)
    listener.close()


def outside(folder: Path) -> dict[str, int | None]:
    """The checkout's top and the folder above the project's home, a file with its time: what no case may touch (a
    folder is there or not, as in files)."""
    return {
        str(path): None if path.is_dir() else path.lstat().st_mtime_ns
        for base in (ROOT, folder.parent.parent)
        for path in base.iterdir()
        if path.name not in UNWALKED
    }


def typed_bare(inputs: list[str]) -> bool:
    """Whether the typed secret is in the inputs other than as a secret's value (one of SECRET_FORMS): Hypothesis
    puts what it drew into other text too, where it is no secret and may be said."""
    for text in inputs:
        for form in SECRET_FORMS:
            text = text.replace(form, "")
        if TYPED_SECRET in text:
            return True
    return False


def check_contract(project: Project, argv: list[str], result, accepted_before: int) -> None:
    """`argv`: the command line, what the case wrote (a stack file, a playbook, a kubeconfig) and its environment."""
    said = result.stdout + result.stderr
    assert "Traceback" not in said, (argv, said[-2000:])
    # an accepted command too (a value typed as it is in settings' table, a dry run's script): printing.WithoutToken
    assert TEST_TOKEN not in said, argv
    assert typed_bare(argv) or TYPED_SECRET not in result.stderr, (argv, result.stderr)
    assert project.private_key not in said, (argv, result.stderr)
    assert result.returncode in (0, 1, 2), (argv, result.returncode, said[-500:])
    lines = result.stderr.strip().splitlines()
    if result.returncode == 2:
        assert lines, (argv, "refused in silence")
        if not lines[0].endswith("cannot start; missing:"):  # up's list of what the laptop lacks (test_tasks.py)
            assert len(lines) == 1 and lines[0].startswith("error: ") and "fix" in lines[0], (argv, result.stderr)
        assert max(map(len, lines)) <= LONGEST_REFUSAL, (argv, result.stderr)
        assert project.listener.accepted == accepted_before, (argv, "connected, then refused its input")
    if result.returncode == 1:  # a failure on the host: said in one line, or in provision's report (FAILED)
        reported = "FAILED" in result.stdout or '"failed": true' in result.stdout
        assert any(line.startswith("error: ") for line in lines) or reported, (argv, said[-500:])


def run_case(project: Project, argv: list[str], env: dict[str, str], cwd: Path | None = None, wrote: str = ""):
    """One command line (in an environment, beside what the case `wrote`) under the contract; a refusal leaves every
    file of the checkout and of the test's home (its project and state folders) as it was. The checkout's walk after
    a refusal is the next case's before."""
    checkout = project.checkout or files(ROOT)
    home, around, accepted = files(project.home), outside(project.folder), project.listener.accepted
    result = invoke(*argv, cwd=cwd or project.folder, env=env)
    check_contract(project, [*argv, wrote, *env.values()], result, accepted)
    assert outside(project.folder) == around, argv
    project.checkout = None
    if result.returncode == 2:
        project.checkout = files(ROOT)
        changed = sorted((checkout ^ project.checkout) | (home ^ files(project.home)))
        assert not changed, (argv, "refused, yet changed", changed[:6])
    return result


#: Flags that take several values, given twice as well as once (`--set k=1 --set k=2`, two hosts).
REPEATED = {"set_", "var", "tags", "host"}
#: Keys a `--set` or `--var` names: MaxText's and the stack's, a step's, the playbook's, secrets, and none.
ASSIGNED_KEYS = st.sampled_from(
    [
        "k",
        "rl.num_generations",
        "train:learning_rate",
        "convert:lazy_load_tensors",
        "hf_access_token",
        "train:HF_TOKEN",
        "data_device",
        "apt_upgrade",
        "maxtext_spec",
    ]
)
#: What a person puts after `--`: a command for the VM, which no task reads.
REMAINDERS = st.lists(st.one_of(st.sampled_from(["df", "-h", "--stack", "ls /"]), HOSTILE_RELATIVE), min_size=1)


@st.composite
def task_calls(draw, host: str):
    """One task with up to three of its flags, each given a hostile value (a `--set` or `--var` often KEY=VALUE, a
    flag that takes several often twice), and the answering host beside a bad --stack or --identity, so that the
    host's absence does not mask their refusal."""
    name = draw(st.sampled_from(sorted(TASKS)))
    chosen = draw(st.lists(st.sampled_from(TASKS[name]), min_size=1, max_size=3, unique_by=lambda flag: flag[0]))
    call = [name]
    for name_, toggle in chosen:
        flag = "--" + name_.rstrip("_").replace("_", "-")
        if toggle:
            call.append(flag)
            continue
        key = draw(ASSIGNED_KEYS) + "=" if name_ in {"set_", "var"} and draw(st.booleans()) else ""
        for _ in range(2 if name_ in REPEATED and draw(st.booleans()) else 1):
            call += [flag, key + draw(HOSTILE_RELATIVE)]
    if "--host" not in call and ("host", False) in TASKS[name]:
        call += ["--host", host]
    return call


@st.composite
def command_lines(draw, host: str):
    """One task, or two in a row (the whole command line is checked before the first acts), sometimes with words
    after `--`."""
    argv = [part for _ in range(draw(st.integers(1, 2))) for part in draw(task_calls(host))]
    return argv + (["--", *draw(REMAINDERS)] if draw(st.integers(0, 9)) == 0 else [])


def fuzzed(examples: int):
    """Hypothesis's settings for a test of `examples` cases by default (TPU_GRPO_FUZZ_EXAMPLES for all of them)."""
    return hypothesis_settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        derandomize=not EXAMPLES,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


@fuzzed(250)
@given(data=st.data())
def test_every_flag_of_every_task_keeps_the_contract(project, data):
    argv = data.draw(command_lines(project.host))
    run_case(project, argv, project.environment())


@fuzzed(2000)
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
    try:
        settings_module.parse({**project.config, key: value}, "dev", project.folder, lenient=True)
    except SettingsError as error:
        # the key itself, the key a rule between keys blames, or a path into it (tpu-grpo:fallback[1].capacity)
        named = re.split(r"[\[.]", str(error).split("=", 1)[0], maxsplit=1)[0]
        assert "\n" not in str(error) and named in {k.name for k in KEYS} and "; fix: " in str(error), str(error)


#: A stack whose places any capacity may be tried at (spot's own, flex-start's run time): what a fallback takes.
SPOT_FALLBACK = {"tpu-grpo:capacity": "spot", "tpu-grpo:reservation": None, "tpu-grpo:maxRunHours": "24"}


def entries_of(key) -> st.SearchStrategy:
    """A setting's entries as a stack file may hold them, drawn from its key's declared fields (keys.Key.entries): each
    field missing, hostile, of another kind (a list, a number, a mapping) or a value the rule takes, and a field the
    entry does not take; as YAML gives them and as JSON text (the CLI's --path writes, a program's config)."""
    zones = st.sampled_from(["us-east5-a", "us-east5-b", "us-central1-b", "us-south1-ai1b", "europe-west4-a"])
    valid = {"capacity": st.sampled_from(list(CAPACITIES)), "zone": zones, "movedFrom": zones}
    wrong = st.one_of(
        HOSTILE,
        st.integers(),
        st.booleans(),
        st.none(),
        st.lists(st.sampled_from(["spot", "us-east5-a"]), max_size=2),
        st.dictionaries(st.sampled_from(["zone", "capacity"]), HOSTILE, max_size=1),
    )
    # every field a value the rule takes but one at most (or a field the entry does not take): the parse reaches it
    optional = {field: valid[field] for field in key.entries if field != "zone"}
    taken = st.fixed_dictionaries({"zone": valid["zone"]}, optional=optional)
    spoilt = st.sampled_from([None, None, *key.entries, "size"])
    entry = st.builds(lambda good, field, bad: {**good, **({field: bad} if field else {})}, taken, spoilt, wrong)
    whole = st.lists(st.one_of(entry, entry, entry, HOSTILE), max_size=3) if key.kind is list else entry
    return st.one_of(whole, whole.map(json.dumps))


@fuzzed(1000)
@given(data=st.data())
def test_every_entry_of_a_setting_with_entries_is_parsed_or_refused_in_one_line(project, data):
    """The fuzzer reaches each field of a setting's entries (tpu-grpo:fallback's places, tpu-grpo:placed) from the
    schema: a new setting with entries is fuzzed the day it is declared. A refusal names the entry's path."""
    key = data.draw(st.sampled_from([key for key in KEYS if key.entries]))
    value = data.draw(entries_of(key))
    try:
        settings_module.parse({**project.config, **SPOT_FALLBACK, key.name: value}, "dev", project.folder, lenient=True)
    except SettingsError as error:
        named = re.split(r"[\[.]", str(error).split("=", 1)[0], maxsplit=1)[0]
        assert "\n" not in str(error) and named in {k.name for k in KEYS} and "; fix: " in str(error), str(error)


@fuzzed(50)
@given(key=st.sampled_from([key.name for key in KEYS]), value=HOSTILE)
def test_every_setting_through_the_tasks_keeps_the_contract(project, key, value):
    (project.folder / "Pulumi.fuzz.yaml").write_text(yaml.safe_dump({"config": {**project.config, key: value}}))
    for argv in (["settings", "--stack", "fuzz"], ["plan", "--stack", "fuzz"]):
        run_case(project, argv, project.environment(), wrote=value)


#: Each capacity as a stack sets it, from its row of catalog/capacity.py: a reservation's name, a run's hours.
CAPACITY = {
    name: {
        "tpu-grpo:capacity": name,
        "tpu-grpo:reservation": "v6e-8-calendar" if row.needs_reservation else None,
        "tpu-grpo:maxRunHours": "24" if row.run_limited else None,
    }
    for name, row in CAPACITIES.items()
}
#: Values near the limits of the rules between settings: names whose derived names pass 40 or 63 characters, label
#: counts and lengths about Google's 64 and 63, ranges that add up to every address, numbers of slices.
VM_NAMES = st.sampled_from([1, 8, 34, 35, 36, 40, 41, 49, 50, 63, 64]).flatmap(
    lambda n: st.sampled_from(["t" * n, ("t9-" * n)[: n - 1] + "x"])
)
LABELS = st.builds(
    lambda count, key_size, value: {(f"k{n}" + "x" * 70)[:key_size]: value for n in range(count)},
    st.sampled_from([0, 1, 62, 63]),
    st.sampled_from([3, 62, 63, 64]),
    st.sampled_from(["", "ml", "x" * 63, "x" * 64, "ML"]),
)
RANGES = st.lists(
    st.sampled_from(
        [
            "203.0.113.7/32",
            "203.0.113.7/32",
            "0.0.0.0/0",
            "0.0.0.0/1",
            "128.0.0.0/1",
            "128.0.0.0/2",
            "192.0.0.0/2",
            "10.0.0.1/8",
            "::/0",
            "::/1",
            "8000::/1",
            "2001:db8::/32",
        ]
    ),
    min_size=1,
    max_size=4,
)
#: Pulumi's stack names (letters, digits, `-`, `_`, `.`; at most 100), each the label `stack` of what its stack makes.
STACK_NAMES = st.sampled_from(["fuzz", "prod-2", "x_y", "s" * 63, "s" * 64, "Prod", "a.b"])
BUCKETS = st.sampled_from(["fuzz-bucket", "a" * 63, "a.b"]) | st.sampled_from(
    ["ab", "a" * 64, "Fuzz", "a_b", "goog-x", "a..b", "192.168.0.1", "my-g00gle"]
)


@st.composite
def stacks_drawn_together(draw):
    """A stack of several settings at once, of each capacity and each placement (the one VM of a machine type, or a
    multi-host slice), so that the rules between settings (derived names, label counts, ranges that add up to
    every address, a slice's store and pools) are reached: its name and its settings."""
    values = {**draw(st.sampled_from(list(CAPACITY.values())))}
    if draw(st.booleans()):
        values |= {"tpu-grpo:machineType": draw(st.sampled_from(list(MACHINES))), "tpu-grpo:model": "qwen3-0.6b"}
    else:
        values |= {
            "tpu-grpo:slice": draw(st.sampled_from(list(SLICES))),
            "tpu-grpo:usePathways": "true",
            "tpu-grpo:checkpointStore": f"gs://{draw(BUCKETS)}/runs",
            "tpu-grpo:bucket": draw(st.sampled_from([None, "true"])),
            "tpu-grpo:numSlices": draw(st.sampled_from([None, *map(str, range(1, MAX_SLICES + 1))])),
        }
    values |= {
        "tpu-grpo:vmName": draw(VM_NAMES),
        "tpu-grpo:labels": draw(LABELS),
        "tpu-grpo:sshSourceRanges": draw(RANGES),
        "tpu-grpo:allowSshFromAnywhere": draw(st.sampled_from([None, "true", "false"])),
        "tpu-grpo:network": draw(st.sampled_from([None, "default", "n" * 63, "n" * 64])),
        "tpu-grpo:placed": draw(
            st.sampled_from(
                [None, *({"zone": "us-east5-b", "capacity": name, "movedFrom": "us-east5-a"} for name in CAPACITIES)]
            )
        ),
    }
    return draw(STACK_NAMES), values


#: Google's rules for what a stack makes, written here from Google's documents, apart from the program's own
#: (tpu_grpo/config/keys.py, rules.py), so that a value both would take wrongly is still caught:
#: - a Compute Engine resource's name (instance, disk, snapshot, network, subnetwork, firewall) and a network tag:
#:   RFC 1035, `[a-z]([-a-z0-9]{0,61}[a-z0-9])?` (cloud.google.com/compute/docs/naming-resources);
#: - labels: at most 64 on a resource; a key begins with a lowercase letter; keys and values hold lowercase letters,
#:   digits, `_` and `-` only, at most 63 characters each (cloud.google.com/compute/docs/labeling-resources);
#: - a GKE cluster's and node pool's name: that form, at most 40 characters
#:   (cloud.google.com/kubernetes-engine/docs/how-to/creating-a-zonal-cluster);
#: - a bucket's name: lowercase letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit; 3 to
#:   63 characters, or up to 222 with dots, each part between them at most 63; not an IP address; not beginning with
#:   `goog`, not holding `google` or a misspelling such as `g00gle` (cloud.google.com/storage/docs/buckets#naming);
#: - a firewall's sourceRanges: CIDR ranges; ranges that hold every address between them (0.0.0.0/0, or 0.0.0.0/1
#:   with 128.0.0.0/1) open port 22 to the internet, which only tpu-grpo:allowSshFromAnywhere may ask
#:   (cloud.google.com/firewall/docs/firewalls).
RFC_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY, LABEL_VALUE = re.compile(r"[a-z][a-z0-9_-]{0,62}"), re.compile(r"[a-z0-9_-]{0,63}")
GKE_NAMED = ("gcp:container/cluster:Cluster", "gcp:container/nodePool:NodePool")


def every_address(ranges: list[str]) -> bool:
    """Whether the ranges hold every IPv4 or every IPv6 address between them: each version's spans, sorted, reach
    from the first address to the last with no gap."""
    networks = [ipaddress.ip_network(text) for text in ranges]
    for version, size in ((4, 2**32), (6, 2**128)):
        reach = 0  # every address below `reach` is held
        for first, last in sorted((int(n[0]), int(n[-1])) for n in networks if n.version == version):
            if first > reach:
                break
            reach = max(reach, last + 1)
        if reach == size:
            return True
    return False


def refused_by_google(plan: dict, values: dict) -> list[str]:
    """What Google's rules (above) refuse of the resources a plan makes, and of the snapshot a move of its data disk
    makes later (`VMNAME-data-` and 8 hex digits)."""
    refused = []

    def name(what: str, value: str, longest: int) -> None:
        if not (RFC_1035.fullmatch(value) and len(value) <= longest):
            refused.append(f"{what} {value!r}")

    for resource in plan["resources"]:
        kind, inputs = resource["type"], resource["inputs"]
        if not kind.startswith("gcp:"):
            continue
        if kind.startswith("gcp:compute/") and "name" in inputs:
            name(kind, inputs["name"], 63)
            for tag in inputs.get("tags") or []:
                name("network tag", tag, 63)
        if kind == "gcp:compute/instance:Instance":
            name("its data disk's snapshot", inputs["name"] + "-data-" + "0" * 8, 63)
        if kind in GKE_NAMED:
            name(kind, inputs["name"], 40)
        if kind == "gcp:storage/bucket:Bucket" and bucket_refused(inputs["name"]):
            refused.append(f"bucket {inputs['name']!r}")
        for labels in (
            inputs.get("labels"),
            inputs.get("resourceLabels"),
            (inputs.get("nodeConfig") or {}).get("resourceLabels"),
        ):
            if labels is not None and (
                len(labels) > 64
                or not all(LABEL_KEY.fullmatch(k) and LABEL_VALUE.fullmatch(v) for k, v in labels.items())
            ):
                refused.append(f"{kind}'s labels {labels}")
        if kind == "gcp:compute/firewall:Firewall":
            ranges = inputs["sourceRanges"]
            if not all(is_network(text) for text in ranges):
                refused.append(f"source ranges {ranges}")
            elif every_address(ranges) and values.get("tpu-grpo:allowSshFromAnywhere") != "true":
                refused.append(f"port 22 open to every address by {ranges}, unasked")
    return refused


def bucket_refused(name: str) -> bool:
    return (
        not re.fullmatch(r"[a-z0-9][a-z0-9._-]*[a-z0-9]", name)
        or not 3 <= len(name) <= (222 if "." in name else 63)
        or any(not 0 < len(part) <= 63 for part in name.split("."))
        or is_address(name)
        or name.startswith("goog")
        or re.search(r"g[o0][o0]g[l1]e", name) is not None
    )


def is_network(text: str) -> bool:
    try:
        return bool(ipaddress.ip_network(text, strict=True))
    except ValueError:
        return False


def is_address(text: str) -> bool:
    try:
        return bool(ipaddress.ip_address(text))
    except ValueError:
        return False


@fuzzed(30)
@given(drawn=stacks_drawn_together())
def test_settings_drawn_together_make_only_what_google_takes(project, drawn):
    """Several settings at once, of each capacity and placement: `settings --json` and `plan --json` keep the
    contract and agree on taking the stack, and what an accepted stack makes, Google's own rules take."""
    stack, changes = drawn
    values = {key: value for key, value in {**project.config, **changes}.items() if value is not None}
    (project.folder / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": values}))
    said = run_case(project, ["settings", "--json", "--stack", stack], project.environment())
    planned = run_case(project, ["plan", "--json", "--stack", stack], project.environment())
    assert said.returncode == planned.returncode, (values, said.stderr, planned.stderr)
    if planned.returncode == 0:
        assert refused_by_google(json.loads(planned.stdout), values) == [], (stack, values)


#: Raw YAML a person (or a paste) puts where a stack file's key goes: every setting's name, names in this project's
#: namespace misspelt, in none, in another; YAML's own tags, complex keys and merge key; names that are environment
#: variables.
RAW_KEYS = st.sampled_from(
    [
        *(key.name for key in KEYS),
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
        "<<",
        "!!merge <<",
    ]
)
#: Raw YAML values: plain and quoted text, numbers, tags, flow collections, anchors, aliases and merges, nesting
#: thousands deep, raw tabs, the values the rules between settings read (labels, ranges, the SSH key), the token.
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
            "!!map [a]",
            "!!map a",
            "!!set {a}",
            "[a, b]",
            "{a: b}",
            "&y [1, 2]",
            "*a",
            "*nosuch",
            "*base",
            "&self [*self]",
            "{<<: *base}",
            "[" * 200 + "]" * 200,
            "[" * 5000 + "]" * 5000,
            "{a: " * 3000 + "b" + "}" * 3000,
            "'" + "a" * 3000 + "'",
            '"\\u2010"',
            "|\n    two\n    lines",
            "\t5",
            "5\t# a tab",
            "us\u2010east5-b",
            "{team: ml}",
            "{Team: ml}",
            "[0.0.0.0/1, 128.0.0.0/1]",
            "[203.0.113.7/32, '::/0']",
            "~/id_ed25519.pub",
            "~/id_ed25519",
            TEST_TOKEN,
            f"{{hf_token: {TYPED_SECRET}}}",
        ]
    ),
    HOSTILE.map(lambda text: yaml.safe_dump(text, default_style='"').strip()),
)
#: Whole raw lines of a `config:` mapping: merge keys, raw tabs, block sequences nested thousands deep, complex keys.
RAW_LINES = st.sampled_from(
    [
        "  <<: *base",
        "  <<: [*base, *other]",
        "  <<: *nosuch",
        "\ttpu-grpo:batches: '5'",
        "  tpu-grpo:batches:\t'5'",
        "  ? tpu-grpo:batches\n  : '5'",
        "  tpu-grpo:labels:\n    " + "- " * 3000 + "x",
        "  tpu-grpo:sshSourceRanges:\n  - 0.0.0.0/1\n  - 128.0.0.0/1",
    ]
)
#: What a stack file may hold above and below its `config:`: anchors for the values to alias and merge (always), a
#: directive, other documents, a second `config:`.
RAW_ANCHORS = (
    "a: &a [x, x]\nb: [*a, *a]\nbase: &base {tpu-grpo:batches: '5'}\nother: &other {tpu-grpo:testBatches: '2'}\n"
)
RAW_HEADS = st.just("") | st.sampled_from(["%YAML 1.1\n---\n", "--- !!map\n"])
RAW_TAILS = st.just("") | st.sampled_from(
    ["---\nconfig: {}\n", "...\n", "config: {}\n", "<<: {config: {}}\n", "--- [a]\n"]
)


@st.composite
def encoded(draw, text: str) -> bytes:
    """A text file as an editor may save it: LF, CRLF or CR line ends; UTF-8 with or without a BOM, UTF-16, Latin-1."""
    text = text.replace("\n", draw(st.just("\n") | st.sampled_from(["\r\n", "\r"])))
    encoding = draw(st.just("utf-8") | st.sampled_from(["utf-8-sig", "utf-16", "latin-1"]))
    return text.encode(encoding, errors="replace")


@st.composite
def raw_stack_files(draw, config: dict):
    """A stack file written as text: the good stack's lines, some replaced or added as raw YAML, text above and
    below, saved as an editor may save it."""
    lines = [f"  {line}" for line in yaml.safe_dump(config).splitlines()]
    for _ in range(draw(st.integers(1, 2))):
        line = draw(st.one_of(st.builds("  {}: {}".format, RAW_KEYS, RAW_VALUES), RAW_LINES))
        lines.insert(draw(st.integers(0, len(lines))), line)
    text = draw(RAW_HEADS) + RAW_ANCHORS + "config:\n" + "\n".join(lines) + "\n" + draw(RAW_TAILS)
    return draw(encoded(text))


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


@fuzzed(100)
@given(data=st.data())
def test_a_stack_file_written_as_raw_text_keeps_the_contract_and_no_wrong_acceptance(project, data):
    """Tags, complex keys, merges, deep nesting, aliases, misnamed keys, tabs, BOMs, line ends and documents, as text
    no yaml.safe_dump writes: `settings` exits 0 or 2 in one line (never a traceback, never the token), and what it
    takes, the oracle takes too."""
    raw = data.draw(raw_stack_files(project.config))
    (project.folder / "Pulumi.fuzz.yaml").write_bytes(raw)
    result = run_case(project, ["settings", "--stack", "fuzz"], project.environment(), wrote=raw.decode("latin-1"))
    if result.returncode == 0:
        text = raw.decode("utf-8")
        assert wrongly_accepted(text) is None, (text, wrongly_accepted(text))


#: Raw YAML for a playbook's parts: each of its keys given a value of every kind.
RAW_PLAYBOOK_PARTS = st.fixed_dictionaries(
    {
        "vars": st.sampled_from(["{who: {default: a}}", "[a]", "3", "{who: {default: a, pattern: '[a-'}}",
                                 "{who: {default: a, choices: 5}}", "{1: {default: a}}", "{who: a}",
                                 "{who: {default: a, choices: [1, 2]}}", "{who: {default: 1, choices: [1, 2]}}",
                                 "{who: {default: a, choices: [[a]]}}", "{who: {default: a, choices: [a, ~]}}",
                                 "{who: {default: [a]}}", "{who: {default: a, help: [a]}}", "{who: {<<: *base}}",
                                 "{base: &base {default: a}, who: {<<: *base, choices: [a]}}",
                                 "{who: " + "{a: " * 3000 + "b" + "}" * 3000 + "}", "{who: {default: '\ta'}}"]),
        "steps": st.sampled_from(["[{name: s, check: 'false', run: 'true'}]", "3", "[[a]]", "[{name: [s]}]",
                                  "[{name: s, check: 5, run: x}]", "[{name: s, check: x, run: x, when: x}]", "{}",
                                  "[{name: s, check: x, run: 'echo {{ who }}'}]", "[" * 3000 + "]" * 3000,
                                  "[{name: s, secret: {source: hf_token, dest: [a]}}]",
                                  "[{name: s, check: x, run: x, tags: [[a]]}]"]),
        "prelude": st.sampled_from(["''", "[a]", "'echo {{ nosuch }}'", "5", "\techo"]),
    }
)  # fmt: skip
#: What the laptop's records may hold: a damaged record (too long, not text, a NUL, no mapping, nested deep).
RAW_RECORDS = st.sampled_from(
    [
        '{"dir": "' + "x" * 300 + '"}',
        '{"dir": 12}',
        '{"dir": "a\\u0000b"}',
        "[1]",
        "not json",
        '{"url": 5}',
        "",
        "[" * 100_000,
    ]
)
#: A kubeconfig's parts, each given a value of every kind; its server, when a cluster has one, refuses at once.
RAW_KUBECONFIG_PARTS = st.fixed_dictionaries(
    {
        "clusters": st.sampled_from(["[{name: c, cluster: {server: 'https://127.0.0.1:1'}}]", "5", "[[a]]",
                                     "[{name: [c]}]", "{c: x}", "[{name: c, cluster: {server: [a]}}]",
                                     "[{name: c, cluster: {server: 'https://127.0.0.1:99999'}}]",
                                     "[{name: c, cluster: {server: '127.0.0.1:1'}}]",
                                     "[{name: c, cluster: {server: 'https://127.0.0.1:1', "
                                     "certificate-authority: /no}}]",
                                     "[{name: c, cluster: {server: 'https://127.0.0.1:1', "
                                     "certificate-authority-data: '!!'}}]"]),
        "contexts": st.sampled_from(["[{name: c, context: {cluster: c, user: u}}]", "5", "[{name: [a]}]",
                                     "[{name: c, context: {cluster: [c]}}]", "[{name: c, context: 5}]",
                                     "[{name: c, context: {cluster: c, user: [u]}}]"]),
        "users": st.sampled_from([f"[{{name: u, user: {{token: {TEST_TOKEN}}}}}]", "5", "[{name: u, user: 5}]",
                                  "[{name: u, user: {client-certificate-data: '!!'}}]", "[]",
                                  f"[{{name: u, user: {{username: a, password: {TYPED_SECRET}}}}}]",
                                  "[{name: u, user: {exec: {command: /nonexistent, "
                                  "apiVersion: client.authentication.k8s.io/v1beta1}}}]"]),
        "current-context": st.sampled_from(["c", "[a]", "5", "''", "nosuch"]),
    }
)  # fmt: skip
#: TPU_GRPO_STACK and TPU_GRPO_STATE as a person may set them: paths up and out, a home's, absolute ones (`{home}`:
#: the test's home), a file, empty, any text.
RAW_STACK_NAMES = st.sampled_from(["dev", "slice", "../../etc/passwd", "~/x", "{home}/elsewhere", "Pulumi.dev.yaml"])
RAW_STATES = st.sampled_from(
    ["../../etc/passwd", "~/x", "~", "{home}/elsewhere/state", "{home}/elsewhere/a-file", "", "/dev/null"]
)


@fuzzed(30)
@given(
    parts=RAW_PLAYBOOK_PARTS,
    record=RAW_RECORDS,
    stack=RAW_STACK_NAMES | HOSTILE_ENVIRONMENT,
    state=RAW_STATES | HOSTILE_ENVIRONMENT,
    kubeconfig=RAW_KUBECONFIG_PARTS,
    data=st.data(),
)
def test_a_playbook_records_and_an_environment_written_as_raw_text_keep_the_contract(
    project, parts, record, stack, state, kubeconfig, data
):
    """A user's own playbook, a damaged record on the laptop, TPU_GRPO_STACK, TPU_GRPO_STATE and TPU_GRPO_KUBECONFIG
    (read by a slice stack's status) of any text: one line and exit 2 (or the answer), never a traceback, never a
    connection before a refusal. Run two folders below the project, so that a path up stays in the test's home."""
    here = project.folder / "deep" / "er"
    here.mkdir(parents=True, exist_ok=True)
    book = "".join(f"{key}: {value}\n" for key, value in parts.items() if data.draw(st.integers(0, 5)))
    (here / "book.yml").write_bytes(data.draw(encoded(book)))
    records = project.folder / ".tpu-grpo-raw"
    for kind in ("fetched", "published"):
        (records / kind).mkdir(parents=True, exist_ok=True)
        (records / kind / "r.json").write_text(record)
    config = "".join(f"{key}: {value}\n" for key, value in kubeconfig.items() if data.draw(st.integers(0, 5)))
    (here / "kubeconfig").write_bytes(data.draw(encoded(config)))
    home = str(project.home)
    env = project.environment(
        TPU_GRPO_STACK=stack.replace("{home}", home),
        TPU_GRPO_KUBECONFIG=str(here / "kubeconfig"),
    )
    raw_state = project.environment(TPU_GRPO_STATE=state.replace("{home}", home))["TPU_GRPO_STATE"]
    host = ["--host", project.host, "--wait", "0"]
    for argv, state_folder in (
        (["provision", "--playbook", "book.yml", *host], str(records)),
        (["runs", "--json", *host], str(records)),
        (["settings"], raw_state),
        (["status", "--stack", "slice"], raw_state),
    ):
        run_case(project, argv, {**env, "TPU_GRPO_STATE": state_folder}, cwd=here, wrote=book + config + record)
