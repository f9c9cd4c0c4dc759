"""Inputs a new user writes that used to end in a traceback, a wrong acceptance or an echoed secret (issue 66): each
refused in one line, exit 2, with nothing echoed that is the token, and each acceptance beside it still taken."""

from __future__ import annotations

import pytest
import yaml

from tests.support import SPOT, TEST_TOKEN, invoke
from tpu_grpo.config import settings as settings_module
from tpu_grpo.config.errors import SettingsError
from tpu_grpo.config.secrets import MAX_SAID


def write_config(stack_dir, values: dict) -> None:
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))


@pytest.mark.parametrize(
    "text, problem",
    [
        ("config:\n  !!int 123: x\n", "found a key that is not text (int) at line 2"),
        ("config:\n  !!binary aGk=: x\n", "found a key that is not text (bytes) at line 2"),
        ("config:\n  ? [a, b]\n  : x\n", "found a key that is not text (list) at line 2"),
        ("config:\n  gcp:zone: " + "[" * 3000 + "]" * 3000 + "\n", "is nested too deep to be a stack file"),
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
            "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nconfig: {}\n",
            "its aliases expand to more than 10000 values",
        ),
    ],
    ids=["int-key", "binary-key", "complex-key", "deep", "alias-bomb"],
)
def test_a_stack_file_yaml_cannot_hold_is_one_line(stack_dir, text, problem):
    (stack_dir / "Pulumi.dev.yaml").write_text(text)
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: Pulumi.dev.yaml='dev' ") and problem in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_few_aliases_are_still_a_stack_file(stack_dir, stack_values):
    text = yaml.safe_dump({"config": stack_values}) + "anchors: &ranges [203.0.113.7/32]\n"
    (stack_dir / "Pulumi.dev.yaml").write_text(text.replace("config:", "config:\n  tpu-grpo:labels: {team: ml}", 1))
    assert invoke("settings", cwd=stack_dir).returncode == 0


def test_the_token_is_never_echoed_in_a_refusal(stack_dir):
    """MaxText's docs pass the token as hf_access_token=$HF_TOKEN; the playbook's variable is hf_token."""
    env = {"HF_TOKEN": TEST_TOKEN}
    for args in (
        ("train", "--set", f"hf_access_token={TEST_TOKEN}", "--host", "tpu@203.0.113.9"),
        ("provision", "--var", f"hf_token={TEST_TOKEN}", "--host", "tpu@203.0.113.9"),
        ("provision", "--var", f"data_device={TEST_TOKEN}", "--host", "tpu@203.0.113.9"),
        ("provision", "--var", "hf_token=hf_typedbyhand", "--host", "tpu@203.0.113.9"),
    ):
        result = invoke(*args, cwd=stack_dir, env=env)
        assert result.returncode == 2, result.stderr
        assert TEST_TOKEN not in result.stderr + result.stdout and "hf_typedbyhand" not in result.stderr
        assert "***" in result.stderr


def test_a_huge_value_is_cut_in_the_middle_keeping_its_fix(stack_dir, stack_values):
    write_config(stack_dir, {**stack_values, "tpu-grpo:vmName": "x" * 200_000})
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line) < MAX_SAID + 100 and "characters left out" in line and "; fix: pulumi config set" in line


def test_an_ssh_key_whose_comment_holds_every_delimiter_is_still_planned(stack_dir, stack_values, key_pair):
    public = key_pair[1].read_text().split()
    mine = stack_dir / "mine.pub"
    mine.write_text(" ".join([*public[:2], "me,a;b|c~d::e@laptop"]) + "\n")
    write_config(stack_dir, {**stack_values, "tpu-grpo:sshPublicKeyPath": str(mine)})
    result = invoke("plan", "--json", cwd=stack_dir)
    assert result.returncode == 0, result.stderr
    [metadata] = [arg for arg in yaml.safe_load(result.stdout)["gcloud"] if arg.startswith("--metadata")]
    assert metadata.startswith("--metadata=^#^") and "me,a;b|c~d::e@laptop" in metadata  # no other delimiter free


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"tpu-grpo:sshSourceRanges": ["0.0.0.0/1", "128.0.0.0/1"]}, "holds 0.0.0.0/1, which opens port 22"),
        ({"tpu-grpo:labels": {f"l{n}": "x" for n in range(63)}}, "holds 63 labels; with tpu-grpo's own 2"),
        ({"tpu-grpo:vmName": "a" * 50}, "is too long: its data disk's snapshot would be named"),
        (
            {
                **SPOT,
                "tpu-grpo:slice": "v6e-16",
                "tpu-grpo:vmName": "a" * 36,
                "tpu-grpo:checkpointStore": "gs://b-x/r",
                "tpu-grpo:usePathways": "true",
            },
            "is too long: its GKE node pools would be named 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-np-0', 41",
        ),
    ],  # fmt: skip
    ids=["ranges-adding-up-to-everything", "65-labels", "vm-name", "slice-name"],
)
def test_what_the_cloud_would_refuse_is_refused_first(stack_values, tmp_path, changes, problem):
    values = {key: value for key, value in {**stack_values, **changes}.items() if value is not None}
    with pytest.raises(SettingsError) as refused:
        settings_module.parse(values, "dev", tmp_path)
    assert problem in str(refused.value)


def test_the_acceptances_beside_those_refusals(stack_values, tmp_path):
    for changes in (
        {"tpu-grpo:sshSourceRanges": ["0.0.0.0/1"]},
        {"tpu-grpo:labels": {f"l{n}": "x" for n in range(62)}},
        {"tpu-grpo:vmName": "a" * 49},
        {"tpu-grpo:sshSourceRanges": ["0.0.0.0/1", "128.0.0.0/1"], "tpu-grpo:allowSshFromAnywhere": "true"},
    ):
        settings_module.parse({**stack_values, **changes}, "dev", tmp_path)


@pytest.mark.parametrize(
    "sets, said",
    [
        (["convert:lazy_load_tensors=true"], "sets lazy_load_tensors, which comes from tpu-grpo:lazyLoadTensors"),
        (["rl.num_generations=2", "rl.num_generations=4"], "sets train's rl.num_generations again (it was '2')"),
    ],
)
def test_a_set_that_the_stack_owns_or_given_twice_is_refused(stack_dir, sets, said):
    result = invoke("pipeline", *(f"--set={each}" for each in sets), "--dry-run", "--host", "tpu@h", cwd=stack_dir)
    assert result.returncode == 2 and said in result.stderr


def test_a_state_folder_under_the_home_is_made_there_not_in_the_checkout(stack_dir, tmp_path, monkeypatch):
    from tpu_grpo.config import laptop_paths

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPU_GRPO_STATE", "~/state")
    monkeypatch.chdir(stack_dir)
    assert laptop_paths.writable_state() == tmp_path / "home" / "state"
    assert not (stack_dir / "~").exists()
