"""The playbook engine without a host: validation, variables, the tutorial's command lines, the
one-round-trip check script (run by a real bash), the extra-deps check (run by a real Python)."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from infra import tpu_host
from tests.support import ROOT, TUTORIAL, write_book
from tpu_grpo.config import settings
from tpu_grpo.provision import engine, playbook
from tpu_grpo.provision import lock as host_lock
from tpu_grpo.provision.playbook import PlaybookError

BOOK = playbook.load()


DEFAULTS = playbook.resolve(BOOK)


def step(name: str) -> playbook.Step:
    return next(step for step in BOOK.steps if step.name == name)


def rendered_run(name: str, values: dict = DEFAULTS) -> str:
    return playbook.render(step(name).run, values).strip()


TUTORIAL_LINES = {
    # step: (the tutorial's line, what the default variables render, why they differ)
    "apt update and upgrade": (
        "sudo apt update && sudo apt upgrade -y --fix-missing",
        "apt-get -o DPkg::Lock::Timeout=900 -o Dpkg::Options::=--force-confdef "
        "-o Dpkg::Options::=--force-confold upgrade -y --fix-missing",
    ),  # no dialogs, waits for the lock
    "build tools": (
        "sudo apt install -y build-essential cmake ninja-build",
        "apt-get -o DPkg::Lock::Timeout=900 install -y build-essential cmake ninja-build",
    ),
    "uv (installer)": (
        "curl -LsSf https://astral.sh/uv/install.sh | sh",
        "curl -LsSf https://astral.sh/uv/0.13.9/install.sh | sh",
    ),  # pinned
    "Python": ("uv python install 3.12", "uv python install 3.12"),
    "venv": (
        "uv venv --python 3.12 --seed maxtext_venv",
        "UV_VENV_CLEAR=1 uv venv --python 3.12 --seed ~/maxtext_venv",
    ),  # runs only when the venv is wrong
    "MaxText": (
        'UV_TORCH_BACKEND=cpu uv pip install "maxtext[tpu-post-train]==0.2.3" --resolution=lowest',
        'UV_TORCH_BACKEND=cpu uv pip install "maxtext[tpu-post-train]==0.2.3" --resolution=lowest',
    ),
    "MaxText post-training extra deps": ("install_tpu_post_train_extra_deps", "install_tpu_post_train_extra_deps"),
}


# ---------------------------------------------------------------- the tutorial's section 3, exactly


@pytest.mark.parametrize("name", TUTORIAL_LINES)
def test_default_variables_render_the_tutorials_commands(name):
    tutorial_line, ours = TUTORIAL_LINES[name]
    assert tutorial_line in TUTORIAL.read_text()
    assert ours in rendered_run(name).splitlines()


def test_the_venv_is_activated_as_in_the_tutorial_before_installing():
    for name in ("MaxText", "MaxText post-training extra deps"):
        assert rendered_run(name).splitlines()[0] == "source ~/maxtext_venv/bin/activate"
    assert "source maxtext_venv/bin/activate" in TUTORIAL.read_text()


def test_steps_follow_the_tutorial_with_the_data_disk_before_the_downloads():
    assert [s.name for s in BOOK.steps] == [
        "apt update and upgrade",
        "build tools",
        "data disk",
        "caches on the data disk",
        "Hugging Face token",
        "idle stop",
        "no idle stop",
        "uv (installer)",
        "uv (pip)",
        "Python",
        "model download started",
        "venv",
        "MaxText",
        "MaxText post-training extra deps",
        "packages exactly as the lock",
        "model downloaded",
    ]


def test_one_maxtext_release_for_the_playbook_the_image_and_the_preflight(monkeypatch):
    """tpu_grpo/catalog/release.py holds the release: the playbook's spec, the slice image's tag and what it installs,
    and the version the pipeline's preflight asks the host for all read it (here, a release that is not 0.2.3)."""
    from tpu_grpo.catalog import images, release
    from tpu_grpo.catalog.accelerators import MACHINES
    from tpu_grpo.jobs import maxtext, pipeline
    from tpu_grpo.provision import image_build

    monkeypatch.setattr(release, "MAXTEXT_VERSION", "9.8.7")
    monkeypatch.setattr(release, "MAXTEXT_SPEC", "maxtext[tpu-post-train]==9.8.7")
    monkeypatch.setitem(playbook.RELEASE_DEFAULTS, "maxtext_spec", release.MAXTEXT_SPEC)
    assert playbook.resolve(playbook.load())["maxtext_spec"] == "maxtext[tpu-post-train]==9.8.7"
    assert images.post_training_image("p", "us-east5").endswith("/maxtext-post-training:9.8.7")
    assert 'uv pip install "maxtext[tpu-post-train]==9.8.7"' in image_build.dockerfile()
    run = maxtext.Run(
        model="llama3.1-8b-Instruct",
        export_model="llama3.1-8b",
        batches=1,
        test_batches=1,
        use_pathways=False,
        lazy_load_tensors=False,
        machine=MACHINES["ct6e-standard-8t"],
        run_name="r",
    )
    assert "\nMAXTEXT_VERSION=9.8.7\n" in pipeline.preflight_script(run, {"shm": 1, "data": 1}, check_tpu=False)
    with pytest.raises(PlaybookError, match="pins MaxText 0.2.3, but tpu-grpo runs MaxText 9.8.7"):
        playbook.resolve(playbook.load(), ["maxtext_spec=maxtext[tpu-post-train]==0.2.3"])
    # a distribution of your own standing in for MaxText (as the tests' stand-ins do) is taken as it is
    assert playbook.resolve(playbook.load(), ["maxtext_spec=six==1.16.0"])["maxtext_spec"] == "six==1.16.0"


def test_the_release_default_is_the_engines_not_the_playbooks(tmp_path):
    text = playbook.PLAYBOOK.read_text().replace(
        "default: ~  # tpu-grpo's MaxText release", "default: maxtext==0.2.4  #"
    )
    with pytest.raises(
        PlaybookError,
        match="variable 'maxtext_spec' takes its default from tpu_grpo/catalog/release.py; fix: default: ~",
    ):
        playbook.load(write_book(tmp_path, text, dedent=False))


def test_defaults_are_the_tutorials_and_the_infra_data_disk():
    assert {
        name: DEFAULTS[name]
        for name in ("apt_upgrade", "uv_source", "python_version", "venv", "maxtext_spec", "extra_deps")
    } == {
        "apt_upgrade": True,
        "uv_source": "installer",
        "python_version": "3.12",
        "venv": "~/maxtext_venv",
        "maxtext_spec": "maxtext[tpu-post-train]==0.2.3",
        "extra_deps": True,
    }
    assert DEFAULTS["data_device"] == tpu_host.DATA_DISK_DEVICE


def test_apt_never_asks_and_waits_for_the_dpkg_lock():
    for name in ("apt update and upgrade", "build tools"):
        script = rendered_run(name)
        assert "export DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a" in script
        assert all("DPkg::Lock::Timeout=900" in line for line in script.splitlines() if line.startswith("apt-get"))
        assert "waiting up to 900 s for the dpkg lock" in script
        assert step(name).become and step(name).network


def test_when_conditions_pick_the_steps():
    chosen = playbook.resolve(BOOK, ["uv_source=pip", "apt_upgrade=false", "extra_deps=false", "data_device="])
    runs = {s.name for s in BOOK.steps if playbook.applies(s, chosen)}
    assert runs == {"build tools", "Hugging Face token", "no idle stop", "uv (pip)", "Python", "venv", "MaxText"}
    assert {s.name for s in BOOK.steps if playbook.applies(s, DEFAULTS)} == {s.name for s in BOOK.steps} - {
        "uv (pip)",
        "packages exactly as the lock",
        "idle stop",
        "model download started",
        "model downloaded",
    }
    idle = playbook.resolve(BOOK, ["idle_stop_minutes=30"])
    assert {s.name for s in BOOK.steps if s.tags == ("idle",) and playbook.applies(s, idle)} == {"idle stop"}


def test_the_stacks_model_is_downloaded_from_the_laptops_hub(stack_dir, monkeypatch):
    """invoke provision passes the stack's model as its Hub id, and $HF_ENDPOINT; without them nothing downloads."""
    monkeypatch.chdir(stack_dir)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/hub")
    values = playbook.resolve(BOOK, [], stack=playbook.stack_values(settings.load(None, lenient=True)))
    assert (values["hf_model"], values["hf_endpoint"]) == ("meta-llama/Llama-3.1-8B-Instruct", "http://127.0.0.1:9/hub")
    assert {s.name for s in BOOK.steps if s.tags == ("download",) and playbook.applies(s, values)} == {
        "model download started",
        "model downloaded",
    }
    started = rendered_run("model download started", values)
    assert (
        "hf download meta-llama/Llama-3.1-8B-Instruct --include '*.safetensors' --include '*.json' "
        "--include 'tokenizer*' --exclude 'original/*' --local-dir \"$folder\""
    ) in started
    assert 'hf cache verify meta-llama/Llama-3.1-8B-Instruct --local-dir "$folder" --fail-on-extra-files' in started
    assert 'date -u +%FT%TZ > "$folder.complete"' in started  # complete only once verified
    assert (
        'export HF_ENDPOINT="http://127.0.0.1:9/hub"' in started
        and "HF_TOKEN=$(cat ~/.cache/huggingface/token)" in started
    )


def test_tags_select_steps_and_an_unknown_tag_is_refused():
    assert [s.name for s in playbook.selected(BOOK, ["uv"])] == ["uv (installer)", "uv (pip)"]
    with pytest.raises(PlaybookError, match=r"--tags 'gpu' matches no step; fix: one of apt, disk"):
        playbook.selected(BOOK, ["gpu"])


BAD_OVERRIDES = [
    (
        "apt_upgrade=yes",
        "--var apt_upgrade: apt_upgrade='yes' is not a boolean; fix: apt_upgrade=true or apt_upgrade=false",
    ),
    (
        "apt_lock_timeout=soon",
        "--var apt_lock_timeout: apt_lock_timeout='soon' is not a whole number; fix: e.g. apt_lock_timeout=900",
    ),
    ("uv_source=brew", "--var uv_source: uv_source='brew' is not one of installer, pip; fix: uv_source=installer"),
    ("python_version=3.12; rm -rf ~", "--var python_version: python_version='3.12; rm -rf ~' does not match"),
    ("maxtext_spec=maxtext", "--var maxtext_spec: maxtext_spec='maxtext' does not match"),
    (
        "maxtext_spec=maxtext[tpu-post-train]==0.2.4",
        "--var 'maxtext_spec=maxtext[tpu-post-train]==0.2.4' pins "
        "MaxText 0.2.4, but tpu-grpo runs MaxText 0.2.3 (its command lines, the slice's image and the preflight: "
        "tpu_grpo/catalog/release.py); fix: remove this --var",
    ),
    ("maxtext_spec=MaxText==0.3.0", "--var 'maxtext_spec=MaxText==0.3.0' pins MaxText 0.3.0"),
    ("venv=$(reboot)", "--var 'venv=$(reboot)': venv is set by tpu-grpo itself"),
    ("colour=blue", "--var 'colour=blue': unknown variable 'colour'; fix: one of apt_upgrade,"),
    ("apt_upgrade", "--var 'apt_upgrade': not KEY=VALUE; fix: one of apt_upgrade,"),
    ("locked=true", "--var 'locked=true': locked is set by tpu-grpo itself"),
]


# ---------------------------------------------------------------- bad input: one line naming where and the fix


@pytest.mark.parametrize("override,message", BAD_OVERRIDES)
def test_bad_var_is_one_clear_line(override, message):
    with pytest.raises(PlaybookError) as error:
        playbook.resolve(BOOK, [override])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


GOOD_STEP = "  - name: hello\n    check: test -f ~/hello\n    run: touch ~/hello\n"


BAD_BOOKS = [
    (
        "vars: {}\nsteps:\n  - name: hello\n    check: test -f x\n    run: touch x\n    sudo: true\n",
        ":3: step 'hello': unknown key 'sudo'; fix: use only become, check, name, network, progress, run, secret, "
        "tags, when",
    ),
    ("steps:\n  - name: hello\n    run: touch x\n", ":2: step 'hello': 'check' is missing; fix: give a bash test"),
    ("steps:\n  - check: true\n    run: touch x\n", ":2: step 1 has no name; fix: add 'name: ...'"),
    (
        "steps:\n  - name: hello\n    check: test -f {{ place }}\n    run: touch x\n",
        ":2: step 'hello': unknown variable '{{ place }}'; fix: declare it under 'vars:'",
    ),
    (
        "steps:\n  - name: hello\n    when: [tuesday]\n    check: 'true'\n    run: 'true'\n",
        ":2: step 'hello': condition 'tuesday' is not 'VAR', 'not VAR' or 'VAR == VALUE'",
    ),
    (
        "steps:\n  - name: hello\n    become: yes please\n    check: 'true'\n    run: 'true'\n",
        ":2: step 'hello': become='yes please' is not true or false",
    ),
    ("steps:\n  - name: hello\n    check: 'true'\n    run: [oops\n", ":5: not valid YAML"),
    ("vars:\n  home: /root\nsteps:\n" + GOOD_STEP, ":2: variable 'home' needs a mapping with 'default'"),
    (
        "vars:\n  port: {default: 22, range: 1-9}\nsteps:\n" + GOOD_STEP,
        ":2: variable 'port': unknown key 'range'; fix: use only choices, default, help, pattern",
    ),
    (
        "steps:\n  - name: token\n    secret: {source: hf_token, dest: /etc/token}\n",
        ":2: step 'token': secret dest '/etc/token' must be a plain path under the home directory",
    ),
    (
        "steps:\n  - name: token\n    become: true\n    secret: {source: hf_token, dest: .token}\n",
        ":2: step 'token': a secret is copied as the SSH user, into its home; fix: remove become",
    ),
    ("hosts: all\nsteps:\n" + GOOD_STEP, ":1: unknown key 'hosts'; fix: use only prelude, steps, vars"),
    ("steps: []\n", ": no steps; fix: add a list under 'steps:'"),
]


@pytest.mark.parametrize("text,message", BAD_BOOKS)
def test_bad_playbook_names_file_line_and_step(tmp_path, text, message):
    path = write_book(tmp_path, text)
    with pytest.raises(PlaybookError) as error:
        playbook.load(path)
    assert str(error.value).startswith(f"{path}{message}") and "\n" not in str(error.value)


def test_bad_var_through_the_cli_exits_2_before_connecting():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "provision",
            "--host",
            "nobody@192.0.2.1",
            "--var",
            "uv_source=brew",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --var uv_source: uv_source='brew' is not one of installer, pip; fix: uv_source=installer"
    )
    assert done.stdout == ""


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--host", "203.0.113.7"], "error: --host '203.0.113.7' is not USER@ADDRESS[:PORT]"),
        (
            ["--host", "ubuntu@203.0.113.7", "--identity", "/no/such/key"],
            "error: --identity '/no/such/key' is not a file",
        ),
        (["--host", "ubuntu@203.0.113.7", "--tags", "gpu"], "error: --tags 'gpu' matches no step"),
        (
            ["--host", "ubuntu@203.0.113.7", "--wait", "soon"],
            "error: --wait 'soon' is not a whole number from 0 to 99999 seconds",
        ),
        (["--host", "ubuntu@203.0.113.7", "--wait", "-5"], "error: --wait '-5' is negative"),
        (
            ["--host", "ubuntu@203.0.113.7", "--locked", "--lock", "/no/such.lock"],
            "error: --lock '/no/such.lock' is not a file",
        ),
    ],
)
def test_bad_hosts_tags_and_locks_are_one_line(argv, message):
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "provision", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1


def test_lock_lines_are_checked_before_they_reach_a_command(tmp_path):
    lock = tmp_path / "host.lock.txt"
    lock.write_text(
        "# python: 3.12.1\n# uv: 0.13.9\nsix==1.16.0\nvllm @ git+https://github.com/vllm-project/vllm@2131b597\n"
    )
    parsed = host_lock.read_lock(lock)
    assert (parsed.python, parsed.uv) == ("3.12.1", "0.13.9")
    values = playbook.resolve(BOOK, [], parsed)
    assert values["locked"] and values["python_version"] == "3.12.1" and values["uv_version"] == "0.13.9"
    lock.write_text("six==1.16.0\nevil; rm -rf ~\n")
    with pytest.raises(PlaybookError, match=r"host.lock.txt:2: 'evil; rm -rf ~' is not 'name==version'"):
        host_lock.read_lock(lock)


EXTRA_DEPS = """\
google-tunix @ https://github.com/google/tunix/archive/683256db1a0919b5cfd46cee52cebc96331494fb.zip
tpu-inference @ https://github.com/vllm-project/tpu-inference/archive/4d08971683a64fd796a1b9fd0bb71128188882d5.zip
vllm @ git+https://github.com/vllm-project/vllm@2131b597b18d051dced4c4a605d362fa37f46ed1
"""  # dependencies/extra_deps/post_train_github_deps.txt of the maxtext 0.2.3 wheel


def fake_installed(site: Path, name: str, url: str) -> None:
    info = site / f"{name.replace('-', '_')}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": url}))


def test_extra_deps_check_reads_the_pinned_commits_from_the_installed_maxtext(tmp_path):
    folder = tmp_path / "venv"
    venv.create(folder)
    site = next(folder.glob("lib/python*/site-packages"))
    (site / "dependencies" / "extra_deps").mkdir(parents=True)
    (site / "dependencies" / "__init__.py").write_text("")
    (site / "dependencies" / "extra_deps" / "__init__.py").write_text("")
    (site / "dependencies" / "extra_deps" / "post_train_github_deps.txt").write_text(EXTRA_DEPS)
    check = playbook.render(step("MaxText post-training extra deps").check, {**DEFAULTS, "venv": str(folder)})
    first = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert first.returncode == 1 and "google-tunix is not installed at commit 683256db" in first.stderr
    assert "vllm is not installed at commit 2131b597" in first.stderr  # every problem, not only the first
    for line in EXTRA_DEPS.splitlines():
        name, url = line.split(" @ ")
        fake_installed(site, name, url)
    without_plugin = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert without_plugin.returncode == 1
    assert without_plugin.stderr.strip() == "maxtext_vllm_adapter (MaxText's vLLM plugin) is not installed"
    fake_installed(site, "maxtext_vllm_adapter", f"file://{site}/maxtext/integration/vllm")
    assert subprocess.run(["bash", "-c", check], capture_output=True, text=True).returncode == 0
    (site / "vllm-0.0.0.dist-info" / "direct_url.json").write_text(json.dumps({"url": "git+https://x/vllm@0000"}))
    stale = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert stale.returncode == 1 and "vllm is not installed at commit 2131b597" in stale.stderr


def test_the_local_token_comes_from_env_then_the_hf_token_file(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert engine.local_secret("hf_token") is None
    from_file, from_env = "hf_" + "FromFile" * 5, "hf_" + "FromEnv" * 5
    (tmp_path / "token").write_text(f"{from_file}\n")
    assert engine.local_secret("hf_token") == from_file
    monkeypatch.setenv("HF_TOKEN", from_env)
    assert engine.local_secret("hf_token") == from_env


def test_every_variable_has_help_and_a_valid_default():
    document = yaml.safe_load(playbook.PLAYBOOK.read_text())
    for name, spec in document["vars"].items():
        assert spec.get("help"), name
        default = BOOK.vars[name].default  # the YAML's, or the engine's (the release: `default: ~`)
        assert default == (
            spec["default"] if name not in playbook.RELEASE_DEFAULTS else playbook.RELEASE_DEFAULTS[name]
        )
        assert playbook.resolve(BOOK, [f"{name}={str(default).lower()}"])[name] == default


def test_maxtext_check_reads_the_installed_version_from_its_dist_info(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    check = playbook.render(step("MaxText").check, {**DEFAULTS, "venv": str(tmp_path / "venv")})
    missing = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stdout == "maxtext (none) installed, 0.2.3 wanted\n"
    (site / "maxtext-0.2.2.dist-info").mkdir()
    (site / "maxtext_vllm-0.2.3.dist-info").mkdir()  # another package whose name only starts alike
    older = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert older.returncode == 1 and older.stdout == "maxtext 0.2.2 installed, 0.2.3 wanted\n"
    (site / "maxtext-0.2.2.dist-info").rename(site / "MaxText-0.2.3.dist-info")  # older wheels keep the case
    assert subprocess.run(["bash", "-c", check], capture_output=True, text=True).returncode == 0


@pytest.mark.parametrize(
    ("prints", "passes"),
    [("uv 0.13.9", True), ("uv 0.13.9 (x86_64-unknown-linux-gnu)", True), ("uv 0.13.90", False), ("uv 0.13", False)],
)
def test_uv_check_compares_the_whole_version(tmp_path, prints, passes):
    (tmp_path / "uv").write_text(f"#!/bin/sh\necho '{prints}'\n")
    (tmp_path / "uv").chmod(0o755)
    for name in ("uv (installer)", "uv (pip)"):
        check = playbook.render(step(name).check, {**DEFAULTS, "uv_version": "0.13.9"})
        done = subprocess.run(["bash", "-c", check], env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
        assert (done.returncode == 0) == passes
    (tmp_path / "uv").unlink()
    assert subprocess.run(["bash", "-c", check], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).returncode != 0
