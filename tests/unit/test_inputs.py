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
        ("config: !!map [a]\n", "expected a mapping node, but found sequence at line 1"),
        ("!!map [a]\n", "expected a mapping node, but found sequence at line 1"),
    ],
    ids=["int-key", "binary-key", "complex-key", "deep", "alias-bomb", "map-tag-on-a-list", "document-map-tag"],
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


def test_a_map_tag_on_a_mapping_is_still_a_stack_file(stack_dir, stack_values):
    text = yaml.safe_dump({"config": stack_values}).replace("config:", "config: !!map", 1)
    (stack_dir / "Pulumi.dev.yaml").write_text(text)
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


@pytest.mark.parametrize(
    "args, secret",
    [
        (("provision", "--var", "HF_TOKEN=hf_typedbyhand"), "hf_typedbyhand"),
        (("provision", "--var", "Api_Secret=hunter2typed"), "hunter2typed"),
        (("provision", "--var", "PULUMI_CONFIG_PASSPHRASE=hunter2typed"), "hunter2typed"),
        (("train", "--set", "nope:HF_TOKEN=hf_typedbyhand"), "hf_typedbyhand"),
        (("train", "--set", "rl.password: hunter2typed"), "hunter2typed"),
        (("status", "--", "HF_TOKEN=hf_typedbyhand", "echo"), "hf_typedbyhand"),
    ],
    ids=["var-HF_TOKEN", "var-api-secret", "var-passphrase", "set-HF_TOKEN", "set-password-colon", "after-dashes"],
)
def test_a_value_under_a_key_that_names_a_secret_is_never_echoed_in_a_refusal(stack_dir, args, secret):
    """HF_TOKEN=, any case of a key holding token, secret, password or passphrase, as KEY=VALUE or KEY: VALUE."""
    result = invoke(*args[:1], "--host", "tpu@203.0.113.9", *args[1:], cwd=stack_dir)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert secret not in result.stderr + result.stdout and "***" in result.stderr


def test_a_label_that_names_a_secret_is_refused_without_its_value(stack_dir, stack_values):
    write_config(stack_dir, {**stack_values, "tpu-grpo:labels": {"password": "Hunter2typed"}})
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and "holds password=***, not a label" in result.stderr, result.stderr


def test_what_no_key_names_a_secret_and_the_fixes_placeholders_are_still_said(stack_dir):
    from tpu_grpo.config.secrets import conceal

    result = invoke("provision", "--host", "tpu@203.0.113.9", "--var", "tokenizer=meta-llama/x", cwd=stack_dir)
    assert result.returncode == 2 and "--var 'tokenizer=meta-llama/x': unknown variable" in result.stderr
    fixes = "fix: HF_TOKEN=hf_... uv run invoke pipeline; PULUMI_CONFIG_PASSPHRASE=THE_PASSPHRASE (or _FILE=FILE)"
    assert conceal(fixes) == fixes


def test_a_character_a_terminal_acts_on_is_shown_escaped_in_a_refusal(stack_dir):
    """A carriage return, an escape sequence or a line separator echoed as typed (the fix for what follows `--` says
    the whole command line) would rewrite the line or split it: each is said as Python writes it."""
    words = ("--identity", "a\rb\x1b[31mc\u2028d", "--", "df")
    result = invoke("ssh", "--host", "tpu@203.0.113.9", *words, cwd=stack_dir)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "--identity 'a\\rb\\x1b[31mc\\u2028d'" in result.stderr


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
        (["rl.num_generations=2", "rl.num_generations=4"], "sets train's rl.num_generations again; fix: give it once"),
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


#: What a kubeconfig's contexts, their names and the current context may be instead of a list, text and text.
KUBECONFIGS_OF_THE_WRONG_TYPES = ["contexts: 5\n", "contexts: [{name: [a]}]\n", "current-context: [a]\n"]
CLUSTER_AT_PORT_1 = (
    "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncurrent-context: c\n"
    "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
)
SLICE = {"tpu-grpo:slice": "v6e-16", "tpu-grpo:usePathways": "true", "tpu-grpo:checkpointStore": "gs://b-x/runs"}


@pytest.mark.parametrize(
    "text, said",
    [
        ("clusters: [\n", "is not YAML at line 2"),
        ("- a\n- b\n", "is not a kubeconfig"),
        ("apiVersion: v1\nkind: Config\nclusters: []\ncurrent-context: x\n", "has no current context naming a cluster"),
        ("clusters: " + "[" * 5000 + "]" * 5000 + "\n", "is nested too deep to be a kubeconfig"),
        *((text, "has no current context naming a cluster") for text in KUBECONFIGS_OF_THE_WRONG_TYPES),
    ],
    ids=["invalid-yaml", "a-list", "no-clusters", "deep", "contexts-a-number", "a-name-a-list", "current-a-list"],
)
def test_a_kubeconfig_the_client_cannot_use_is_one_line(tmp_path, text, said):
    from tpu_grpo.cloud import kube

    (tmp_path / "config").write_text(text)
    with pytest.raises(kube.KubeconfigError) as refused:
        kube.given_kubeconfig(str(tmp_path / "config"))
    assert (
        refused.value.exit_code == 2
        and said in str(refused.value)
        and "fix: point TPU_GRPO_KUBECONFIG" in str(refused.value)
    )


@pytest.mark.parametrize(
    "text, said",
    [
        *((text, "has no current context naming a cluster with a server") for text in KUBECONFIGS_OF_THE_WRONG_TYPES),
        (CLUSTER_AT_PORT_1 + "users: 5\n", "is refused by the Kubernetes client (AttributeError: "),
        (CLUSTER_AT_PORT_1.replace("}}]", ", certificate-authority: /no}}]", 1), "(ConfigException: File does not"),
    ],
    ids=["contexts-a-number", "a-name-a-list", "current-a-list", "users-a-number", "no-such-authority"],
)
def test_a_kubeconfig_of_the_wrong_types_is_one_line_from_a_slice_stacks_status(
    stack_dir, stack_values, home, text, said
):
    """A slice stack's status reads TPU_GRPO_KUBECONFIG (jobs/targets.py's SliceTarget); a cluster that refuses at once
    beside it shows the kubeconfig taken."""
    from tpu_grpo.config.kubeconfig import kubeconfig

    write_config(stack_dir, {**stack_values, **SLICE})
    (stack_dir / "config").write_text(text)
    env = {**home, "TPU_GRPO_KUBECONFIG": str(stack_dir / "config")}
    result = invoke("status", cwd=stack_dir, env=env)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert said in result.stderr and "fix: point TPU_GRPO_KUBECONFIG" in result.stderr
    (stack_dir / "config").write_text(kubeconfig("c", "127.0.0.1:1", "Q0E="))
    taken = invoke("status", cwd=stack_dir, env=env)
    assert taken.returncode == 1 and "the cluster at https://127.0.0.1:1 cannot be reached" in taken.stderr


def test_a_kubeconfig_of_a_cluster_is_taken(tmp_path):
    from tpu_grpo.cloud import kube
    from tpu_grpo.config.kubeconfig import kubeconfig

    (tmp_path / "config").write_text(kubeconfig("c", "203.0.113.5", "Q0E="))
    assert kube.given_kubeconfig(str(tmp_path / "config"))["current-context"] == "c"


@pytest.mark.parametrize("where", ["flag", "environment"])
def test_a_stack_named_by_a_path_is_refused_before_connecting_with_host_too(stack_dir, where):
    """--host skips the stack's settings, not the check of its name: `--stack ../x` or TPU_GRPO_STACK=../../etc/passwd
    would otherwise be taken; the host is never reached (a documentation address that would time out)."""
    flag = ("--stack", "../x") if where == "flag" else ()
    env = {"TPU_GRPO_STACK": "../../etc/passwd"} if where == "environment" else {}
    for task in ("ssh", "status", "logs", "timeline"):
        result = invoke(task, "--host", "tpu@203.0.113.9", *flag, cwd=stack_dir, env=env)
        named = "--stack='../x'" if where == "flag" else "TPU_GRPO_STACK='../../etc/passwd'"
        assert (result.returncode, result.stderr.split(" is not")[0]) == (2, f"error: {named}"), result.stderr
    taken = invoke("status", "--host", "tpu@203.0.113.9", "--stack", "prod", "--json", "--wait", "0", cwd=stack_dir)
    assert "is not a Pulumi stack name" not in taken.stderr  # a name, though no stack file holds it: the host decides


def test_what_follows_a_double_dash_is_refused_not_dropped(stack_dir):
    """The fix is the line as typed, what followed `--` as ssh's --command (tests/host/test_ssh.py runs it)."""
    result = invoke("ssh", "--host", "tpu@203.0.113.9", "-s", "dev", "--wait", "5", "--", "df", "-h", cwd=stack_dir)
    assert result.returncode == 2
    assert result.stderr == (
        "error: `-- df -h`: no task reads what follows --; fix: uv run invoke ssh --host tpu@203.0.113.9 --stack dev "
        "--wait 5 --command 'df -h' runs a command on the VM (every task takes flags only)\n"
    )
    elsewhere = invoke("status", "--host", "tpu@203.0.113.9", "--", "df", "-h", cwd=stack_dir)
    assert "fix: uv run invoke ssh --command 'df -h' runs a command on the VM" in elsewhere.stderr
    empty = invoke("ssh", "--host", "tpu@203.0.113.9", "--command", "", cwd=stack_dir)
    assert empty.returncode == 2 and empty.stderr.startswith("error: --command '' is empty; fix:")


GOOD_PLAYBOOK = "vars:\n  who: {default: a}\nsteps:\n  - name: hello\n    check: 'false'\n    run: echo {{ who }}\n"


@pytest.mark.parametrize(
    "text, said",
    [
        ("steps:\n  - {name: a, check: x, run: y}\n1: x\n", "unknown key 1"),
        ("vars: [a, b]\nsteps: []\n", "vars is a list, not a mapping"),
        ("steps: 3\n", "steps is a number, not a list"),
        ("prelude: [a]\n" + GOOD_PLAYBOOK, "prelude is a list, not text"),
        (GOOD_PLAYBOOK.replace("{default: a}", "{default: a, pattern: '[a-'}"), "pattern '[a-' is not a regular"),
        (GOOD_PLAYBOOK.replace("{default: a}", "{default: a, choices: 5}"), "choices is a number, not a list"),
        (GOOD_PLAYBOOK.replace("name: hello", "name: [hello]"), "step 1's name is a list, not text"),
        (GOOD_PLAYBOOK.replace("check: 'false'", "check: 5"), "check is a number, not text"),
        (GOOD_PLAYBOOK.replace("{default: a}", "{default: a, choices: [1, 2]}"), "choice 1 is a number, not text"),
        (GOOD_PLAYBOOK.replace("{default: a}", "{default: a, choices: [[a]]}"), "choice 1 is a list, not text"),
    ],
    ids=[
        "mixed-keys",
        "vars-list",
        "steps-number",
        "prelude-list",
        "bad-pattern",
        "choices-number",
        "name",
        "check",
        "choices-numbers",
        "choices-lists",
    ],
)
def test_a_playbook_of_the_wrong_types_is_one_line_naming_what_it_holds(stack_dir, text, said):
    (stack_dir / "book.yml").write_text(text)
    result = invoke("provision", "--playbook", "book.yml", "--host", "tpu@203.0.113.9", cwd=stack_dir)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert said in result.stderr and "fix: " in result.stderr


def test_a_playbook_of_the_right_types_is_taken(stack_dir):
    from tpu_grpo.provision import playbook

    (stack_dir / "book.yml").write_text(GOOD_PLAYBOOK.replace("{default: a}", "{default: a, pattern: '[a-z]+'}"))
    book = playbook.load(stack_dir / "book.yml")
    assert [step.name for step in book.steps] == ["hello"] and book.vars["who"].pattern == "[a-z]+"
    (stack_dir / "book.yml").write_text(GOOD_PLAYBOOK.replace("{default: a}", "{default: '1', choices: ['1', '2']}"))
    assert playbook.load(stack_dir / "book.yml").vars["who"].choices == ("1", "2")


def test_settings_json_says_the_problems_settings_and_plan_say(stack_dir, stack_values):
    """A stack still holding a placeholder: `settings` and `plan --json` list it as pending, and so does
    `settings --json`, beside the settings."""
    import json

    write_config(stack_dir, {**stack_values, "gcp:project": "YOUR_PROJECT"})
    said = json.loads(invoke("settings", "--json", cwd=stack_dir).stdout)
    planned = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    assert said["pending"] == planned["pending"] and [each["key"] for each in said["pending"]] == ["gcp:project"]
    assert said["warnings"] == planned["warnings"]
    assert said["settings"]["gcp:project"] == {"value": "YOUR_PROJECT", "default": None}
    assert "gcp:project" in invoke("settings", cwd=stack_dir).stdout.split("still to set before `pulumi up`: ")[1]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_terminal_that_cannot_say_every_character_gets_a_question_mark_not_a_traceback(stack_dir, encoding):
    import subprocess
    import sys

    from tests.support import ROOT, task_environment
    from tests.unit.test_cli_safety import write_events

    events = write_events(stack_dir / "events").parent
    for task in (["settings"], ["plan"], ["metrics", "--events", str(events)]):
        result = subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), *task],
            cwd=stack_dir,
            env=task_environment({"PYTHONIOENCODING": encoding, "COLUMNS": "200"}),
            capture_output=True,
            encoding=encoding,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr and ("us-east5-b" in result.stdout or "metrics.png" in result.stdout)


@pytest.mark.parametrize("folder", ["x" * 300, 12, ["a"], "a\0b", "/nonexistent/fetched"])
def test_a_damaged_fetch_record_is_no_reason_for_runs_to_fail(stack_dir, tmp_path, folder):
    """A fetched/RUN.json whose `dir` is a name too long for the filesystem, no text, or holds a NUL names no copy;
    `runs` lists the rest (the good record beside it)."""
    import json

    state = tmp_path / "state"
    (state / "fetched").mkdir(parents=True)
    (state / "fetched/bad.json").write_text(json.dumps({"dir": folder}))
    (tmp_path / "copy").mkdir()
    (state / "fetched/good.json").write_text(json.dumps({"dir": str(tmp_path / "copy")}))
    env = {"TPU_GRPO_STATE": str(state)}
    result = invoke("runs", "--json", "--host", "tpu@203.0.113.9", "--wait", "0", cwd=stack_dir, env=env)
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert [(row["run"], row["state"]) for row in said["runs"]] == [("good", "fetched")]
    # a partial answer exits 0 (docs/reference.md's exit codes say so), naming the source that did not answer
    assert said["sources"]["host"].startswith("no answer: ") and said["sources"]["laptop"] == "answered"


@pytest.mark.parametrize(
    "key, value, said",
    [
        (
            "tpu-grpo:zone",
            "us-east5-b",
            "did you mean gcp:zone? pulumi config rm tpu-grpo:zone, then pulumi config set gcp:zone",
        ),
        ("tpu-grpo:sshKey", "~/.ssh/id.pub", "did you mean sshPublicKeyPath?"),
        ("tpu-grpo:hfToken", "hf_typedbyhand", "it is HF_TOKEN, the Hugging Face token, which never goes into a stack"),
        ("tpu-grpo:stack", "prod", "it is TPU_GRPO_STACK, the stack a task acts on"),
        ("tpu-grpo:machinetype", "ct6e-standard-4t", "did you mean machineType?"),
    ],
)
def test_an_unknown_key_is_matched_by_its_name_across_namespaces_and_the_environment(
    stack_dir, stack_values, key, value, said
):
    write_config(stack_dir, {**stack_values, key: value})
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "hf_typedbyhand" not in result.stderr


def test_an_unnamespaced_key_is_told_its_namespaced_name(stack_dir, stack_values):
    write_config(stack_dir, {**stack_values, "capacity": "spot"})
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and result.stderr.rstrip().endswith("fix: name it tpu-grpo:capacity"), result.stderr
    write_config(stack_dir, {**stack_values, "flavour": "x"})
    assert "or name it e.g. gcp:zone" in invoke("settings", cwd=stack_dir).stderr  # nothing of that name


@pytest.mark.parametrize(
    "zone, marked",
    [("us\u2010east5-b", "(holds U+2010 HYPHEN)"), ("us-\u0435ast5-b", "(holds U+0435 CYRILLIC SMALL LETTER IE)")],
)
def test_a_look_alike_character_is_marked_where_the_value_is_echoed(stack_dir, stack_values, zone, marked):
    write_config(stack_dir, {**stack_values, "gcp:zone": zone})
    result = invoke("settings", cwd=stack_dir)
    assert result.returncode == 2 and f"gcp:zone='{zone}' {marked} is not" in result.stderr, result.stderr
    write_config(stack_dir, stack_values)
    flagged = invoke("train", "--batches", "5\u0035\u0660", "--host", "tpu@203.0.113.9", cwd=stack_dir)
    assert flagged.returncode == 2 and "(holds U+0660 ARABIC-INDIC DIGIT ZERO)" in flagged.stderr
    assert "holds" not in invoke("train", "--batches", "x", "--host", "tpu@203.0.113.9", cwd=stack_dir).stderr


# Found by tests/unit/test_fuzz.py once widened (issue 66), each fixed where it was.


def test_a_token_typed_as_a_value_is_not_printed_by_an_accepted_command(stack_dir, stack_values):
    write_config(stack_dir, {**stack_values, "tpu-grpo:sshPublicKeyPath": TEST_TOKEN})
    env = {"HF_TOKEN": TEST_TOKEN}
    for args in (("settings",), ("train", "--run-name", TEST_TOKEN, "--dry-run", "--host", "tpu@203.0.113.9")):
        result = invoke(*args, cwd=stack_dir, env=env)
        assert result.returncode == 0 and TEST_TOKEN not in result.stdout + result.stderr


@pytest.mark.parametrize("stack", ["Prod", "a.b", "s" * 64])
def test_a_stack_whose_name_no_label_can_hold_makes_no_label_google_refuses(stack_dir, stack_values, stack):
    """Pulumi's stack names take capitals, `.` and 100 characters; a Compute Engine label's value none of them."""
    import json
    import re

    (stack_dir / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": stack_values}))
    result = invoke("plan", "--json", "--stack", stack, cwd=stack_dir)
    labels = [
        resource["inputs"].get("labels") or {} for resource in json.loads(result.stdout or "{}").get("resources", [])
    ]
    assert result.returncode == 2 or all(
        re.fullmatch(r"[a-z0-9_-]{0,63}", value) for each in labels for value in each.values()
    )


@pytest.mark.parametrize(
    "words", [["a\nb"], ["x" * 1500], ["{'token': 'hunter2typed'}"]], ids=["newline", "long", "quoted-secret"]
)
def test_what_follows_a_double_dash_is_one_line_under_the_cap_without_a_secret(stack_dir, words):
    result = invoke("status", "--host", "tpu@203.0.113.9", "--", *words, cwd=stack_dir)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and len(lines[0]) <= MAX_SAID + 60
    assert "hunter2typed" not in result.stderr


def test_a_secret_set_twice_is_refused_without_its_first_value(stack_dir):
    sets = ("--set", "train:HF_TOKEN=hf_typedbyhand", "--set", "train:HF_TOKEN=hf_other")
    result = invoke("train", *sets, "--host", "tpu@203.0.113.9", cwd=stack_dir)
    assert result.returncode == 2 and "hf_typedbyhand" not in result.stderr


def test_a_record_nested_deep_is_no_reason_for_runs_to_fail(stack_dir, tmp_path):
    (tmp_path / "state" / "fetched").mkdir(parents=True)
    (tmp_path / "state" / "fetched" / "deep.json").write_text("[" * 100_000)
    env = {"TPU_GRPO_STATE": str(tmp_path / "state")}
    result = invoke("runs", "--json", "--host", "tpu@203.0.113.9", "--wait", "0", cwd=stack_dir, env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr


# ---------------------------------------------------------------- round 6 (issue 82): the token checked for what it is

REAL_FORM = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"  # hf_ and 34 letters, as the Hub issues them


@pytest.mark.parametrize(
    "token",
    ["hf_...", "hf_" + "a" * 20 + " " + "b" * 14, "a" * 37, f"{REAL_FORM}\n{REAL_FORM}", "e"],
    ids=["placeholder", "space-inside", "no-prefix", "two-lines", "one-letter"],
)
def test_a_token_that_is_none_is_refused_before_provisioning_connects(stack_dir, token):
    from tests.unit.test_cli_safety import Listener

    listener = Listener()
    try:
        result = invoke("provision", "--host", f"tpu@127.0.0.1:{listener.port}", cwd=stack_dir, env={"HF_TOKEN": token})
    finally:
        listener.close()
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert (
        "error: HF_TOKEN holds no Hugging Face token (" in result.stderr and "fix: copy a read token" in result.stderr
    )
    assert listener.accepted == 0 and (token not in result.stderr or token == "e")


def test_a_token_file_an_editor_saved_with_a_bom_and_crlf_is_used_and_masked_as_used(stack_dir, tmp_path, monkeypatch):
    """huggingface_hub drops line breaks and spaces (its _clean_token) and keeps a byte-order mark; tpu-grpo drops
    that too, and masks the token it would send, not the file's bytes."""
    (tmp_path / "token").write_bytes(b"\xef\xbb\xbf" + REAL_FORM.encode() + b"\r\n")
    env = {"HF_TOKEN": "", "HF_TOKEN_PATH": str(tmp_path / "token")}
    result = invoke("train", "--run-name", REAL_FORM, "--dry-run", "--host", "tpu@203.0.113.9", cwd=stack_dir, env=env)
    assert result.returncode == 0 and "export RUN_NAME=***" in result.stdout, result.stderr
    assert REAL_FORM not in result.stdout + result.stderr
    from tpu_grpo.config import secrets

    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert secrets.hub_token() == REAL_FORM  # what provisioning and a slice's Secret are given


def test_a_one_letter_token_hides_no_letter_of_a_refusal(stack_dir):
    result = invoke("train", "--batches", "0", "--host", "tpu@203.0.113.9", cwd=stack_dir, env={"HF_TOKEN": "e"})
    assert result.returncode == 2 and "is not a whole number" in result.stderr and "***" not in result.stderr


def test_a_token_path_that_names_a_folder_is_said_to_be_one(stack_dir, tmp_path):
    result = invoke(
        "provision", "--host", "tpu@203.0.113.9", cwd=stack_dir, env={"HF_TOKEN": "", "HF_TOKEN_PATH": str(tmp_path)}
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert (
        f"the Hugging Face token file '{tmp_path}' (HF_TOKEN_PATH, else HF_HOME's `token`) is a folder" in result.stderr
    )


# ---------------------------------------------------------------- round 6 (issue 82): the rest


def _frame(data: bytes) -> bytes:
    """One TFRecord frame, as TensorBoard's writer frames a record: its length, its masked CRC-32C, the data, its."""
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


@pytest.mark.parametrize("kind", ["not-an-event", "a-folder", "a-dangling-link", "no-events"])
def test_an_events_folder_that_holds_no_events_is_one_line(stack_dir, tmp_path, kind):
    events = tmp_path / "tb"
    events.mkdir()
    name = events / "events.out.tfevents.1.host"
    if kind == "not-an-event":
        name.write_bytes(_frame(b"\xff\xff\xff not a protocol buffer"))
    elif kind == "a-folder":
        name.mkdir()
    elif kind == "a-dangling-link":
        name.symlink_to(tmp_path / "gone")
    said = {
        "not-an-event": "holds records that are no TensorBoard events; fix: ",
        "a-folder": "is no file, where TensorBoard's events files are; fix: ",
        "a-dangling-link": "is a link to nothing, where TensorBoard's events files are; fix: ",
        "no-events": "no TensorBoard events files (events.out.tfevents.*): ",
    }[kind]
    result = invoke("metrics", "--events", str(events), cwd=stack_dir, env={"TPU_GRPO_STATE": str(tmp_path / "s")})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert said in result.stderr and "fix: " in result.stderr and "Traceback" not in result.stderr


def test_a_public_key_given_as_the_identity_is_refused_with_its_private_half(stack_dir, tmp_path):
    public = tmp_path / "id_ed25519.pub"
    public.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDc0dGVzdGtleWZvcnRwdWdycG8 me@laptop\n")
    result = invoke("ssh", "--host", "tpu@203.0.113.9", "--identity", str(public), cwd=stack_dir)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert f"is a public key (ssh-ed25519); fix: --identity {tmp_path / 'id_ed25519'}, its private half" in (
        result.stderr
    )


def test_freeze_does_not_replace_a_file_it_did_not_write(stack_dir):
    """`freeze --lock playbooks/host.yml` replaced the playbook; a lock it wrote is replaced, as `metrics --out`
    replaces a plot of its own."""
    (stack_dir / "host.yml").write_text("steps: []\n")
    result = invoke("freeze", "--host", "tpu@203.0.113.9", "--lock", "host.yml", cwd=stack_dir)
    assert result.returncode == 2 and "is a file `invoke freeze` did not write" in result.stderr, result.stderr
    assert (stack_dir / "host.yml").read_text() == "steps: []\n"
    (stack_dir / "old.lock").write_text("# tpu-grpo host lock: `invoke provision --locked` installs exactly this\n")
    again = invoke("freeze", "--host", "tpu@203.0.113.9", "--wait", "0", "--lock", "old.lock", cwd=stack_dir)
    assert "did not write" not in again.stderr


@pytest.mark.parametrize("given", ["$HOME/x", "${HOME}/x", "%USERPROFILE%\\x", "~nouser/x"])
def test_a_state_folder_no_shell_expanded_is_refused_and_nothing_is_made(stack_dir, given):
    """As a .env file writes it, unexpanded: it made folders named `$HOME` in the checkout."""
    result = invoke(
        "train", "--run-name", "r", "--host", "tpu@203.0.113.9", cwd=stack_dir, env={"TPU_GRPO_STATE": given}
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert f"TPU_GRPO_STATE={given!r} holds a variable or home no shell expanded" in result.stderr
    assert sorted(path.name for path in stack_dir.iterdir()) == ["Pulumi.dev.yaml", "Pulumi.yaml"]


@pytest.mark.parametrize(
    "args, meant",
    [
        (("fetch", "--run-name", "x"), "fetch has no flag --run-name; fix: --run, fetch's own"),
        (("train", "--run", "x"), "train has no flag --run; fix: --run-name, train's own"),
        (("pipeline", "--batch", "3"), "pipeline has no flag --batch; fix: --batches, pipeline's own"),
        (("status", "--zzz"), "status has no flag --zzz; fix: its flags: uv run invoke status --help"),
    ],
)
def test_a_flag_of_another_task_is_answered_with_this_tasks_own(stack_dir, args, meant):
    """pipeline, train and export name a run with --run-name; fetch, metrics, publish and tensorboard with --run."""
    result = invoke(*args, cwd=stack_dir)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {meant}"), result.stderr


def test_a_stack_named_in_another_case_than_its_file_is_pointed_to_it(stack_dir):
    (stack_dir / "Pulumi.r6.yaml").write_text((stack_dir / "Pulumi.dev.yaml").read_text())
    result = invoke("settings", cwd=stack_dir, env={"TPU_GRPO_STACK": "R6"})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "has no stack file Pulumi.R6.yaml; fix: TPU_GRPO_STACK=r6, the stack whose file is Pulumi.r6.yaml" in (
        result.stderr
    )


def test_a_dry_run_of_a_recovering_pipeline_needs_no_pulumi(stack_dir):
    """A dry run prints the scripts and brings no VM back: only a real run needs the Pulumi CLI (on no PATH here)."""
    dry = invoke("pipeline", "--dry-run", "--recover", "2", cwd=stack_dir, env={"HF_TOKEN": TEST_TOKEN})
    assert dry.returncode == 0 and "# tpu-grpo train" in dry.stdout, dry.stderr
    real = invoke("pipeline", "--recover", "2", cwd=stack_dir, env={"HF_TOKEN": TEST_TOKEN})
    assert real.returncode == 2 and "no pulumi on PATH" in real.stderr, real.stderr


@pytest.mark.parametrize("host", ["a\nb", "u@" + "a" * 3000])
def test_a_bad_host_beside_a_double_dash_is_said_first_on_one_line(stack_dir, host):
    """The fix for `-- df` repeats the command line, host and all: a bad host is said before it, whole enough to read
    (a 3,000-character host's fix was cut in the middle, never saying the host was wrong)."""
    result = invoke("ssh", "--host", host, "--", "df", cwd=stack_dir)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: --host ") and "no task reads what follows" not in result.stderr


def test_a_fallback_places_zone_warning_names_its_entry_and_a_place_is_warned_of_once(stack_dir, stack_values):
    import json

    flex = {"zone": "us-west1-c", "capacity": "flex-start"}
    values = {**stack_values, **SPOT, "tpu-grpo:maxRunHours": "24", "tpu-grpo:fallback": [flex]}
    write_config(stack_dir, {key: value for key, value in values.items() if value is not None})
    said = json.loads(invoke("plan", "--json", cwd=stack_dir).stdout)
    [warning] = [place["warning"] for place in said["places"] if place["warning"]]
    assert warning.startswith("tpu-grpo:fallback[0].zone us-west1-c is not among the zones known to offer v6e flex")
    assert warning.endswith("fix: pulumi config set --path 'tpu-grpo:fallback[0].zone' ZONE, one of those")
    own = {**values, "tpu-grpo:capacity": "flex-start", "gcp:zone": "us-west4-a", "tpu-grpo:fallback": ["us-east5-a"]}
    write_config(stack_dir, {key: value for key, value in own.items() if value is not None})
    text = invoke("plan", cwd=stack_dir).stdout
    assert " ".join(text.split()).count("us-west4-a is not among the zones") == 1, text


def test_more_test_examples_than_gsm8ks_test_split_has_are_refused_before_a_plan(stack_dir, stack_values):
    """GSM8K's test split has 1,319 rows: MaxText slices past its end without a word, scoring fewer examples."""
    write_config(stack_dir, {**stack_values, "tpu-grpo:testBatches": "1000", "tpu-grpo:reportBatches": "400"})
    result = invoke("plan", cwd=stack_dir)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    said = "tpu-grpo:testBatches=1000 and reportBatches 400 take 1400 test examples at 1 a batch, and GSM8K's test "
    assert said in result.stderr
    assert "fix: pulumi config set tpu-grpo:reportBatches 319 (or fewer testBatches)" in result.stderr
    write_config(stack_dir, {**stack_values, "tpu-grpo:testBatches": "1000", "tpu-grpo:reportBatches": "319"})
    assert invoke("plan", cwd=stack_dir).returncode == 0
