"""Bad settings are refused before the program declares anything, with one line naming the
key, the value and the fix; and both readers of the stack file see the same settings."""

from __future__ import annotations

import subprocess

import pytest

from infra import offline
from tpu_grpo.config import settings as settings_module
from tpu_grpo.config.errors import SettingsError


class _Missing:
    """A setting left out of the stack (its repr names it, so test ids are the same in every process)."""

    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()

BAD = [
    ("gcp:project", MISSING, "is not set", "pulumi config set gcp:project"),
    ("gcp:project", "YOUR_PROJECT_ID", "placeholder", "pulumi config set gcp:project"),
    ("gcp:project", "My_Project", "not a Google Cloud project id", "pulumi config set gcp:project"),
    ("gcp:zone", MISSING, "is not set", "pulumi config set gcp:zone"),
    ("gcp:zone", "YOUR_ZONE", "placeholder", "pulumi config set gcp:zone"),
    ("gcp:zone", "us-east5", "region-letter", "pulumi config set gcp:zone us-east5-b"),
    ("gcp:zone", "useast5-b", "region-letter", "pulumi config set gcp:zone us-east5-b"),
    (
        "tpu-grpo:reservation",
        MISSING,
        "is not set, and capacity reservation needs it",
        "pulumi config set tpu-grpo:reservation",
    ),
    ("tpu-grpo:reservation", "YOUR_RESERVATION_NAME", "placeholder", "pulumi config set tpu-grpo:reservation"),
    ("tpu-grpo:reservation", "My Reservation", "is not a reservation name", "pulumi config set tpu-grpo:reservation"),
    (
        "tpu-grpo:reservation",
        "projects/p/reservations/r",
        "is not a reservation name",
        "pulumi config set tpu-grpo:reservation",
    ),
    ("tpu-grpo:vmName", "-tpu", "Compute Engine name", "pulumi config set tpu-grpo:vmName"),
    (
        "tpu-grpo:machineType",
        "ct5lp-hightpu-8t",
        "known TPU machine type",
        "pulumi config set tpu-grpo:machineType ct6e-standard-8t",
    ),
    (
        "tpu-grpo:bootDiskGb",
        "100",
        "from 200 to 65536 GB (200: the tutorial's",
        "pulumi config set tpu-grpo:bootDiskGb 200",
    ),
    ("tpu-grpo:bootDiskGb", "big", "is not a whole number", "pulumi config set tpu-grpo:bootDiskGb 200"),
    ("tpu-grpo:dataDiskGb", "50", "from 100 to 65536 GB", "pulumi config set tpu-grpo:dataDiskGb 500"),
    (
        "tpu-grpo:sshSourceRanges",
        ["10.0.0.300/32"],
        "not a CIDR range",
        "pulumi config set --path 'tpu-grpo:sshSourceRanges[0]'",
    ),
    (
        "tpu-grpo:sshSourceRanges",
        ["203.0.113.7/24"],
        "not a CIDR range",
        "pulumi config set --path 'tpu-grpo:sshSourceRanges[0]'",
    ),
    (
        "tpu-grpo:sshSourceRanges",
        "office",
        "not a CIDR range",
        # a text, not a list: a --path into it is refused, so the fix removes it first
        "pulumi config rm tpu-grpo:sshSourceRanges && pulumi config set --path 'tpu-grpo:sshSourceRanges[0]'",
    ),
    ("tpu-grpo:sshSourceRanges", [], "is empty", "pulumi config set --path 'tpu-grpo:sshSourceRanges[0]'"),
    (
        "tpu-grpo:sshSourceRanges",
        ["YOUR_PUBLIC_IP/32"],
        "placeholder",
        "pulumi config set --path 'tpu-grpo:sshSourceRanges[0]'",
    ),
    ("tpu-grpo:sshUser", "Root User", "not a Linux user name", "pulumi config set tpu-grpo:sshUser"),
    ("tpu-grpo:labels", {"Team": "ML"}, "not a label", "pulumi config set --path 'tpu-grpo:labels.team'"),
    (
        "tpu-grpo:model",
        "llama2-7b",
        "is not a model MaxText 0.2.3 post-trains here",
        "pulumi config set tpu-grpo:model llama3.1-8b-Instruct",
    ),
    ("tpu-grpo:batches", "0", "from 1 to 100000", "pulumi config set tpu-grpo:batches 50"),
    ("tpu-grpo:batches", "abc", "is not a whole number", "pulumi config set tpu-grpo:batches 50"),
    ("tpu-grpo:usePathways", "maybe", "is not true or false", "pulumi config set tpu-grpo:usePathways false"),
]


def with_value(values: dict, key: str, value) -> dict:
    values = dict(values)
    if value is MISSING:
        values.pop(key)
    else:
        values[key] = value
    return values


@pytest.mark.parametrize("key, value, problem, fix", BAD, ids=[f"{k}={v!r}" for k, v, *_ in BAD])
def test_bad_setting_is_refused_before_any_resource(stack_values, key, value, problem, fix):
    mocks = offline.RecordingMocks()
    with pytest.raises(SettingsError) as raised:
        offline.run(with_value(stack_values, key, value), "dev", mocks=mocks)
    message = str(raised.value)
    assert mocks.resources == []
    assert "\n" not in message
    assert message.startswith(f"{key}=")
    assert problem in message
    assert f"fix: {fix}" in message


@pytest.fixture
def key_file(tmp_path, stack_values):
    def write(text: str):
        path = tmp_path / "key.pub"
        path.write_text(text)
        return with_value(stack_values, "tpu-grpo:sshPublicKeyPath", str(path))

    return write


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----\n",
            "is a private key",
        ),
        ("hello world\n", "not an OpenSSH public key"),
        ("ssh-ed25519 not*base64 me@host\n", "not an OpenSSH public key"),
        # a valid ed25519 blob labelled as RSA
        (
            "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x\n",
            "not an OpenSSH public key",
        ),
    ],
)
def test_public_key_file_must_be_a_public_key(key_file, text, problem):
    mocks = offline.RecordingMocks()
    with pytest.raises(SettingsError, match=problem) as raised:
        offline.run(key_file(text), "dev", mocks=mocks)
    assert raised.value.key == "tpu-grpo:sshPublicKeyPath"
    assert mocks.resources == []


def test_missing_public_key_file_names_ssh_keygen(stack_values, tmp_path):
    values = with_value(stack_values, "tpu-grpo:sshPublicKeyPath", str(tmp_path / "nope.pub"))
    with pytest.raises(SettingsError, match="is not a file; fix: ssh-keygen -t ed25519"):
        offline.run(values, "dev")


def test_the_printed_ssh_keygen_makes_the_key_the_stack_names_when_pasted(stack_values, tmp_path, monkeypatch):
    """The stack file's `~/.ssh/...` (the committed default): the fix is pasted into bash as printed, and makes the
    very key the setting names (a quoted `~` would not expand: ssh-keygen would write to a folder named `~`)."""
    home = tmp_path / "home with space"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    values = with_value(stack_values, "tpu-grpo:sshPublicKeyPath", "~/.ssh/id_new.pub")
    with pytest.raises(SettingsError) as raised:
        offline.run(values, "dev")
    command = raised.value.fix.split(", or ")[0]
    made = subprocess.run(["bash", "-c", command], input="\n\n", capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (home / ".ssh" / "id_new.pub").is_file() and not (tmp_path / "~").exists()
    offline.run(values, "dev")  # the setting now names a real key


def test_lenient_parse_keeps_placeholders_and_missing_key_as_pending(stack_values, tmp_path):
    values = {**stack_values, "gcp:project": "YOUR_PROJECT_ID", "tpu-grpo:sshPublicKeyPath": str(tmp_path / "nope.pub")}
    settings = settings_module.parse(values, "dev", tmp_path, lenient=True)
    assert [error.key for error in settings.pending] == ["gcp:project", "tpu-grpo:sshPublicKeyPath"]
    assert settings.project == "YOUR_PROJECT_ID"


def test_lenient_parse_still_refuses_real_mistakes(stack_values, tmp_path):
    with pytest.raises(SettingsError, match="gcp:zone"):
        settings_module.parse({**stack_values, "gcp:zone": "us-east5"}, "dev", tmp_path, lenient=True)


def test_invoke_side_reads_the_same_settings_as_the_pulumi_program(stack_dir, stack_values):
    from_yaml = settings_module.load("dev", stack_dir)
    from_pulumi, _, _ = offline.run(stack_values, "dev")
    assert from_yaml == from_pulumi
    assert from_yaml.boot_disk_gb == 200 and from_yaml.ssh_source_ranges == ("203.0.113.7/32", "198.51.100.0/24")


def test_pulumi_cli_string_forms_are_understood(stack_values, tmp_path):
    """`pulumi config set` stores scalars as strings; a comma list is accepted for ranges."""
    values = {
        **stack_values,
        "tpu-grpo:sshSourceRanges": "203.0.113.7/32, 198.51.100.0/24",
        "tpu-grpo:usePathways": "true",
        "tpu-grpo:dataDiskGb": 1000,
    }
    settings = settings_module.parse(values, "dev", tmp_path)
    assert settings.ssh_source_ranges == ("203.0.113.7/32", "198.51.100.0/24")
    assert settings.use_pathways is True and settings.data_disk_gb == 1000


@pytest.mark.parametrize(
    "key, fix",
    [
        (
            "tpu-grpo:bootdiskGb",
            "did you mean bootDiskGb? pulumi config rm tpu-grpo:bootdiskGb, then "
            "pulumi config set tpu-grpo:bootDiskGb 200",
        ),
        (
            "tpu-grpo:machinetype",
            "did you mean machineType? pulumi config rm tpu-grpo:machinetype, then "
            "pulumi config set tpu-grpo:machineType ct6e-standard-8t",
        ),
        ("tpu-grpo:flavour", "pulumi config rm tpu-grpo:flavour (settings: `invoke settings`)"),
    ],
)
def test_unknown_key_in_the_stack_file_is_refused(stack_dir, key, fix):
    """A typo would otherwise be ignored by `pulumi up` and silently fall back to nothing."""
    text = (stack_dir / "Pulumi.dev.yaml").read_text()
    (stack_dir / "Pulumi.dev.yaml").write_text(text + f"  {key}: '300'\n")
    with pytest.raises(SettingsError) as raised:
        settings_module.load("dev", stack_dir)
    assert str(raised.value) == f"{key}='300' is not a setting of this project; fix: {fix}"


@pytest.mark.parametrize("value", ["us-east5-b1", "us-east5-b ", "us-east5-b\n", " us-east5-b"])
def test_zone_pattern_is_anchored(stack_values, value):
    with pytest.raises(SettingsError, match="is not a zone"):
        offline.run(with_value(stack_values, "gcp:zone", value), "dev")


@pytest.mark.parametrize(
    "key, good",
    [
        ("gcp:project", "grpo-lab-123"),
        ("tpu-grpo:reservation", "v6e-8-calendar"),
        ("tpu-grpo:vmName", "tpu-grpo"),
        ("tpu-grpo:network", "default"),
        ("tpu-grpo:sshUser", "ubuntu"),
        ("tpu-grpo:serviceAccount", "sa@grpo-lab-123.iam.gserviceaccount.com"),
    ],
)
@pytest.mark.parametrize("garbage", ["x!", " ", "\n"])
def test_every_pattern_checked_setting_refuses_trailing_garbage(stack_values, key, good, garbage):
    """Each pattern must match the whole value: `$` alone lets a trailing newline through."""
    values = {**stack_values, "tpu-grpo:network": "default", key: good}
    offline.run(values, "dev")  # the good value passes
    with pytest.raises(SettingsError) as raised:
        offline.run({**values, key: good + garbage}, "dev")
    assert raised.value.key == key


def test_label_patterns_refuse_trailing_garbage(stack_values):
    offline.run({**stack_values, "tpu-grpo:labels": {"team": "ml"}}, "dev")
    for labels in ({"team\n": "ml"}, {"team": "ml\n"}, {"team": "ml "}):
        with pytest.raises(SettingsError, match="not a label"):
            offline.run({**stack_values, "tpu-grpo:labels": labels}, "dev")


@pytest.mark.parametrize("anywhere", ["0.0.0.0/0", "::/0"])
def test_ssh_open_to_the_internet_needs_an_explicit_yes(stack_values, anywhere):
    values = {**stack_values, "tpu-grpo:sshSourceRanges": ["203.0.113.7/32", anywhere]}
    with pytest.raises(SettingsError) as raised:
        offline.run(values, "dev")
    message = str(raised.value)
    assert message.startswith("tpu-grpo:sshSourceRanges=")
    assert f"holds {anywhere}, which opens port 22 of the VM" in message
    assert "pulumi config set tpu-grpo:allowSshFromAnywhere true" in message
    settings, resources, _ = offline.run({**values, "tpu-grpo:allowSshFromAnywhere": "true"}, "dev")
    firewall = next(r for r in resources if r.type == "gcp:compute/firewall:Firewall")
    assert firewall.inputs["sourceRanges"] == ["203.0.113.7/32", anywhere]


def test_pulumi_up_refuses_an_unknown_key_the_engine_passes(stack_values, monkeypatch):
    """`pulumi up` hands the program every config key in $PULUMI_CONFIG (as every language host
    does); the program itself refuses a misspelled one instead of dropping it."""
    import json

    import pulumi

    from tests.support import run_entry_point

    values = {**stack_values, "tpu-grpo:serviceAcount": "sa@grpo-lab-123.iam.gserviceaccount.com"}
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(offline.config_for_pulumi(values)))
    mocks = offline.RecordingMocks()
    with pytest.raises(pulumi.RunError) as raised:
        run_entry_point({}, mocks)
    assert mocks.resources == []
    assert str(raised.value).startswith(
        "tpu-grpo:serviceAcount='sa@grpo-lab-123.iam.gserviceaccount.com' is not a "
        "setting of this project; fix: did you mean serviceAccount?"
    )


def test_missing_stack_file_says_how_to_make_it(stack_dir):
    with pytest.raises(SettingsError, match="has no stack file Pulumi.prod.yaml; fix: pulumi stack init prod"):
        settings_module.load("prod", stack_dir)


# Issue 50's settings, each refused by the parser of its kind, as the flags of that kind are.
KINDS_REFUSED = [
    ("tpu-grpo:batches", "200000", "from 1 to 100000"),  # as `--batches 200000`
    ("tpu-grpo:batches", "9" * 5000, "is not a whole number"),  # int() refuses over 4,300 digits: a traceback
    ("tpu-grpo:batches", "١٢٠", "digits 0-9"),
    ("tpu-grpo:testBatches", "1_0", "digits 0-9"),
    ("tpu-grpo:serviceAccount", "`id`@a.com", "is not a service account email"),
    ("tpu-grpo:serviceAccount", "$(id)x@p.iam.gserviceaccount.com", "is not a service account email"),
    *[
        (key, value, "is not a Hugging Face repository id")
        for key in ("tpu-grpo:tokenizer", "tpu-grpo:dataset")
        for value in ("a--b/c", "a/b..c", "a/b.", "a/b-", "a/b.git", "a", "a/b/c")
    ],
    ("tpu-grpo:datasetConfig", "a b", "is not a name"),
    ("tpu-grpo:datasetConfig", "main\nx", "is not a name"),
    ("tpu-grpo:datasetConfig", "x" * 10_000, "is not a name"),
    ("tpu-grpo:labels", {"app": "mine"}, "labels every resource app="),
    ("tpu-grpo:labels", {"stack": "x"}, "labels every resource stack="),
    ("tpu-grpo:checkpointStore", "gs://g00gle-runs/runs", "look-alike"),
    ("tpu-grpo:checkpointStore", "gs://a..b/runs", "is not a bucket name"),
    ("tpu-grpo:datasetConfig", {"secure": "AAABAJ5x"}, "is a Pulumi secret"),
    ("tpu-grpo:fallback", {"secure": "AAABAJ5x"}, "is a Pulumi secret"),  # said "is not a list" (round 6)
]


@pytest.mark.parametrize(
    "key, value, problem", KINDS_REFUSED, ids=[f"{k}={str(v)[:20]!r}" for k, v, _ in KINDS_REFUSED]
)
def test_each_kind_of_setting_is_refused_by_its_parser(stack_values, tmp_path, key, value, problem):
    with pytest.raises(SettingsError) as raised:
        settings_module.parse(with_value(stack_values, key, value), "dev", tmp_path)
    assert problem in str(raised.value) and "\n" not in str(raised.value)


def test_what_cloud_storage_and_google_take_is_taken(stack_values, tmp_path):
    dotted = ".".join(["a" * 26, "b" * 26, "c" * 27])  # 81 characters: a valid dotted bucket name
    assert len(dotted) == 81
    values = {
        **stack_values,
        "tpu-grpo:checkpointStore": f"gs://{dotted}/runs",
        "tpu-grpo:capacity": "flex-start",
        "tpu-grpo:reservation": None,
        "tpu-grpo:maxRunHours": "24",
        "gcp:zone": "us-south1-ai1b",
    }
    chosen = settings_module.parse(values, "dev", tmp_path)
    assert chosen.checkpoint_store == f"gs://{dotted}/runs" and chosen.zone == "us-south1-ai1b"
    assert chosen.warnings == []  # the flex-start zone the warning names is one gcp:zone takes


def test_a_misspelt_namespace_is_refused_not_silently_dropped(stack_values, tmp_path):
    with pytest.raises(SettingsError) as raised:
        settings_module.parse({**stack_values, "tpu_grpo:lossAlgo": "gspo-token"}, "dev", tmp_path)
    assert "did you mean tpu-grpo:lossAlgo?" in str(raised.value)


def test_a_one_vm_slice_beside_another_machine_is_refused(stack_values, tmp_path):
    values = {**stack_values, "tpu-grpo:slice": "v6e-8", "tpu-grpo:machineType": "ct6e-standard-1t"}
    with pytest.raises(SettingsError) as raised:
        settings_module.parse(values, "dev", tmp_path)
    assert "machineType ct6e-standard-1t is a v6e-1" in str(raised.value)


def test_true_and_false_are_said_as_the_stack_file_writes_them(stack_values, tmp_path):
    values = {**stack_values, "tpu-grpo:slice": "v6e-16", "tpu-grpo:checkpointStore": "gs://grpo-lab-runs/runs"}
    with pytest.raises(SettingsError) as raised:
        settings_module.parse(values, "dev", tmp_path)
    assert str(raised.value).startswith("tpu-grpo:usePathways=false ")


def test_settings_say_what_an_unset_key_comes_to_in_the_table_and_in_json_alike(stack_dir, stack_values):
    """The data keys come to MaxText's or the model table's defaults, a one-VM stack's slice to its machine's, and
    --json says the same values, with whence, where it used to say null."""
    import json

    import yaml

    from tests.support import invoke

    values = {**stack_values, "tpu-grpo:machineType": "ct6e-standard-1t", "tpu-grpo:model": "qwen3-0.6b"}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    found = json.loads(invoke("settings", "--json", cwd=stack_dir).stdout)["settings"]
    assert found["tpu-grpo:dataset"] == {"value": "openai/gsm8k", "default": "MaxText's default"}
    assert found["tpu-grpo:datasetConfig"] == {"value": "main", "default": "MaxText's default"}
    assert found["tpu-grpo:lossAlgo"] == {"value": "grpo", "default": "MaxText's default"}
    assert found["tpu-grpo:tokenizer"]["default"] == "the model table's" and found["tpu-grpo:tokenizer"]["value"]
    assert found["tpu-grpo:slice"] == {"value": "v6e-1", "default": "the one VM of machineType"}
    assert found["tpu-grpo:idleStopMinutes"] == {"value": 0, "default": "capacity reservation's default"}
    assert found["tpu-grpo:machineType"] == {"value": "ct6e-standard-1t", "default": None}
    table = " ".join(invoke("settings", cwd=stack_dir, env={"COLUMNS": "300"}).stdout.split())
    for key, said in found.items():
        if said["default"] not in (None, "unset"):
            value = str(said["value"]).lower() if isinstance(said["value"], bool) else str(said["value"])
            assert f"{key} │ {value or '(none)'} ({said['default']})" in table, key


def test_a_new_stack_names_only_what_is_its_own_and_the_rest_is_the_tutorials(stack_dir, stack_values):
    """Project, zone, the reservation (or another capacity), the SSH key and who may reach it: the other keys come to
    the tutorial's values, said as such; a stack that does not exist is told exactly the keys still to set."""
    import json

    import yaml

    from tests.support import invoke
    from tpu_grpo.config.keys import KEY, KEYS

    own = ("gcp:project", "gcp:zone", "tpu-grpo:reservation", "tpu-grpo:sshPublicKeyPath", "tpu-grpo:sshSourceRanges")
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": {key: stack_values[key] for key in own}}))
    found = json.loads(invoke("settings", "--json", cwd=stack_dir).stdout)["settings"]
    tutorial = {
        "tpu-grpo:vmName": "tpu-grpo",
        "tpu-grpo:machineType": "ct6e-standard-8t",
        "tpu-grpo:dataDiskGb": 500,
        "tpu-grpo:sshUser": "ubuntu",
        "tpu-grpo:model": "llama3.1-8b-Instruct",
        "tpu-grpo:batches": 50,
        "tpu-grpo:testBatches": 10,
        "tpu-grpo:usePathways": False,
        "tpu-grpo:lazyLoadTensors": False,
    }
    assert {key: found[key] for key in tutorial} == {
        key: {"value": value, "default": "the tutorial's"} for key, value in tutorial.items()
    }
    assert {key.name for key in KEYS if key.required} | {"tpu-grpo:reservation"} == set(own)
    missing = invoke("settings", "--stack", "prod", cwd=stack_dir)
    assert missing.returncode == 2 and missing.stderr.strip().endswith(
        "fix: pulumi stack init prod && "
        + " && ".join(KEY[key].set_command() for key in (*own[:2], *own[3:], own[2]))
        + " (no reservation: pulumi config set tpu-grpo:capacity spot, or flex-start or on-demand, instead) "
        "(or --stack dev)"
    )


def test_a_setting_is_declared_once_as_a_field_with_its_key():
    """docs/development.md's recipe: a new setting is a field of StackValues declared with `setting(...)`; its key
    (name, kind from the field's type, field name) follows, and parse checks it by its rule like any other."""
    from dataclasses import dataclass

    from tpu_grpo.config import keys
    from tpu_grpo.config.values import Refused, whole

    @dataclass(frozen=True, kw_only=True)
    class Extended(keys.StackValues):
        warmup_steps: int | None = keys.setting("tpu-grpo:warmupSteps", "steps of warm-up", "10", rule=whole(0, 99))
        tags: tuple[str, ...] = keys.setting("tpu-grpo:tags", "run tags", "a,b")

    found = {key.name: key for key in keys.keys_of(Extended)}
    assert [key.name for key in keys.keys_of(Extended)][: len(keys.KEYS)] == [key.name for key in keys.KEYS]
    assert (found["tpu-grpo:warmupSteps"].field, found["tpu-grpo:warmupSteps"].kind) == ("warmup_steps", int)
    assert (found["tpu-grpo:tags"].field, found["tpu-grpo:tags"].kind) == ("tags", list)
    assert found["tpu-grpo:warmupSteps"].parse("12") == 12
    with pytest.raises(Refused, match="is not a whole number from 0 to 99"):
        found["tpu-grpo:warmupSteps"].parse("100")
    assert all(key.field and not (key.required and key.default) for key in keys.KEYS)


SPOT_WITH_FALLBACK = {"tpu-grpo:capacity": "spot", "tpu-grpo:reservation": None}


def spot_stack(stack_values, **changes):
    values = {**stack_values, **SPOT_WITH_FALLBACK, **changes}
    return {key: value for key, value in values.items() if value is not None}


@pytest.mark.parametrize(
    "fallback, problem",
    [
        ([{"zone": "us-east5-a", "size": 8}], "holds 'size', which a place does not take (capacity, zone)"),
        ([{"capacity": "spot"}], "a place without its zone"),
        ([{"zone": "east"}], "[0].zone='east' is not a zone of the form region-letter"),
        ([{"zone": "us-east5-a", "capacity": "cheap"}], "[0].capacity='cheap' is not one of reservation, spot"),
        ([{"zone": "us-east5-a"}, {"zone": "us-east5-b", "capacity": ["spot"]}], "[1].capacity=['spot'] is not one"),
        ([{"zone": ["us-east5-a"], "capacity": "spot"}], "[0].zone=['us-east5-a'] is not a zone of the form"),
        ([], "=[] is empty: leave it unset to try gcp:zone alone"),
        ("east", "[0].zone='east' is not a zone of the form region-letter"),
    ],
)
def test_a_fallback_entry_that_is_no_place_is_refused_with_what_is_wrong(stack_values, tmp_path, fallback, problem):
    """The wrong part of an entry is named by its path as a user types it (`tpu-grpo:fallback[1].capacity`), with its
    value and the command that sets it; a list where a name goes is refused as one (it was a TypeError)."""
    with pytest.raises(SettingsError) as refused:
        settings_module.parse(spot_stack(stack_values, **{"tpu-grpo:fallback": fallback}), "dev", tmp_path)
    assert str(refused.value).startswith("tpu-grpo:fallback") and problem in str(refused.value)
    assert "fix: " in str(refused.value)


def test_each_fallback_place_is_checked_as_the_stacks_own_would_be(stack_values, tmp_path):
    """A place of a capacity that needs a setting the stack lacks is refused by its index; a setting one place takes
    is no longer refused at the others; the same place twice is refused."""

    def refused(**changes) -> str:
        with pytest.raises(SettingsError) as error:
            settings_module.parse(spot_stack(stack_values, **changes), "dev", tmp_path)
        return str(error.value)

    flex = [{"zone": "us-east5-a", "capacity": "flex-start"}]
    said = refused(**{"tpu-grpo:fallback": flex})
    assert said.startswith(
        "tpu-grpo:fallback[0]='flex-start in us-east5-a' cannot be tried: there, tpu-grpo:maxRunHours"
    )
    chosen = settings_module.parse(
        spot_stack(stack_values, **{"tpu-grpo:fallback": flex, "tpu-grpo:maxRunHours": "24"}), "dev", tmp_path
    )
    assert (chosen.capacity, chosen.max_run_hours) == ("spot", None)  # taken by the flex-start place only
    assert refused(**{"tpu-grpo:maxRunHours": "24", "tpu-grpo:fallback": [{"zone": "us-east5-a"}]}).startswith(
        "tpu-grpo:maxRunHours=24 is set, but only flex-start VMs have a maximum run time"
    )
    twice = refused(**{"tpu-grpo:fallback": [{"zone": "us-east5-a"}, {"zone": "us-east5-a", "capacity": "spot"}]})
    assert twice.startswith("tpu-grpo:fallback[1]='spot in us-east5-a' is listed twice")


@pytest.mark.parametrize(
    "placed, said",
    [
        (
            '{"zone": "us-central1-b", "capacity": ["on-demand"]}',
            "tpu-grpo:placed.capacity=['on-demand'] is not one of reservation",
        ),
    ],
)
def test_a_recorded_place_that_is_none_is_refused_by_its_part(stack_values, tmp_path, placed, said):
    with pytest.raises(SettingsError) as refused:
        settings_module.parse(spot_stack(stack_values, **{"tpu-grpo:placed": placed}), "dev", tmp_path)
    assert str(refused.value).startswith(said)


def test_the_recorded_place_is_the_stacks_place_while_it_is_one_of_its_places(stack_values, tmp_path):
    """tpu-grpo:placed puts the VM where `invoke up` got chips, with that capacity's defaults; a record the stack no
    longer lists (gcp:zone or fallback changed since) is ignored, and the stack's own place holds."""
    fallback = {"tpu-grpo:fallback": [{"zone": "us-central1-b", "capacity": "on-demand"}]}
    placed = {"tpu-grpo:placed": '{"zone": "us-central1-b", "capacity": "on-demand"}'}
    chosen = settings_module.parse(spot_stack(stack_values, **fallback, **placed), "dev", tmp_path)
    assert (chosen.zone, chosen.region, chosen.capacity) == ("us-central1-b", "us-central1", "on-demand")
    assert (chosen.home.zone, chosen.home.capacity) == ("us-east5-b", "spot")
    assert chosen.store.name == "disk"  # spot's: one store for every place, which a preempted VM's runs outlive
    zones = settings_module.parse(
        spot_stack(stack_values, **{"tpu-grpo:fallback": "us-east5-a,us-east5-c"}), "dev", tmp_path
    )
    assert [str(place) for place in zones.candidates] == [
        "spot in us-east5-b",
        "spot in us-east5-a",
        "spot in us-east5-c",
    ]
    stale = {"tpu-grpo:placed": '{"zone": "europe-west4-a", "capacity": "spot"}'}
    ignored = settings_module.parse(spot_stack(stack_values, **fallback, **stale), "dev", tmp_path)
    assert (ignored.zone, ignored.capacity) == ("us-east5-b", "spot")
