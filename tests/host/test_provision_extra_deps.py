"""MaxText's post-training extra deps, and `--locked` with packages pinned to commits, for real.

The host gets an installable stand-in of the maxtext wheel (tests/doubles/standin_install) whose
`install_tpu_post_train_extra_deps` is MaxText 0.2.3's own script. Its
`post_train_github_deps.txt` pins three small local packages, named like the real ones, by
commit in the real file's two URL forms: a commit's zip archive (google-tunix, tpu-inference)
and `git+...@commit` (vllm). The host's uv finds the stand-in wheel through `find-links`;
setuptools and uv come from PyPI, as on a VM.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doubles.wheels import write_wheel
from tests.support import DOUBLES, statuses

STANDIN = DOUBLES / "standin_install"
SPEC = "maxtext-standin[tpu-post-train]==0.2.3"
EXTRA_DEPS = "MaxText post-training extra deps"
LOCKED = "packages exactly as the lock"
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


@dataclass
class Packages:
    """The local stand-ins of MaxText's GitHub deps: each package's two commits and its URL per commit."""

    folder: Path
    commits: dict[str, list[str]]
    urls: dict[str, list[str]]

    def deps_file(self) -> str:
        """post_train_github_deps.txt as MaxText writes it, pinning every package's first commit."""
        return "".join(f"{name} @ {urls[0]}\n" for name, urls in self.urls.items())


def make_package_repo(folder: Path, name: str) -> list[str]:
    """A git repo of a small setuptools package with two commits (versions 0.1.1 and 0.1.2)."""
    folder.mkdir(parents=True)
    git(folder, "init", "-q", "-b", "main")
    module = name.replace("-", "_")
    commits = []
    for number in (1, 2):
        (folder / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools>=78.1.0"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{name}"\nversion = "0.1.{number}"\n\n[tool.setuptools]\npy-modules = ["{module}"]\n'
        )
        (folder / f"{module}.py").write_text(f"COMMIT_NUMBER = {number}\n")
        git(folder, "add", "-A")
        git(folder, "commit", "-q", "-m", f"version {number}")
        commits.append(git(folder, "rev-parse", "HEAD").strip())
    return commits


def make_packages(folder: Path, seen_as: str) -> Packages:
    """The packages in `folder`, their URLs as the host names that folder (`seen_as`)."""
    commits, urls = {}, {}
    for name, repo in (("google-tunix", "tunix"), ("tpu-inference", "tpu-inference")):
        commits[name] = make_package_repo(folder / "src" / repo, name)
        archive = folder / repo / "archive"
        archive.mkdir(parents=True)
        for commit in commits[name]:  # what GitHub serves as /archive/<commit>.zip
            git(
                folder / "src" / repo,
                "archive",
                "--format=zip",
                f"--prefix={repo}-{commit}/",
                "-o",
                str(archive / f"{commit}.zip"),
                commit,
            )
        urls[name] = [f"file://{seen_as}/{repo}/archive/{commit}.zip" for commit in commits[name]]
    commits["vllm"] = make_package_repo(folder / "vllm", "vllm")
    urls["vllm"] = [f"git+file://{seen_as}/vllm@{commit}" for commit in commits["vllm"]]
    return Packages(folder, commits, urls)


def build_standin_wheel(folder: Path, deps_file: str) -> Path:
    """maxtext_standin-0.2.3-py3-none-any.whl: tests/doubles/standin_install plus the deps file."""
    files = {
        str(path.relative_to(STANDIN)): path.read_bytes()
        for path in sorted(STANDIN.rglob("*"))
        if path.is_file() and path.name != "README.md" and "__pycache__" not in path.parts
    }
    files["dependencies/extra_deps/post_train_github_deps.txt"] = deps_file.encode()
    return write_wheel(
        folder,
        "maxtext-standin",
        "0.2.3",
        files,
        metadata=b"Provides-Extra: tpu-post-train\nRequires-Dist: setuptools>=78.1.0; extra == 'tpu-post-train'\n",
        entry_points=b"[console_scripts]\ninstall_tpu_post_train_extra_deps = "
        b"dependencies.scripts.install_post_train_extra_deps:main\n",
    )


@pytest.fixture
def standin_host(make_host):
    """A fresh test host whose uv finds the stand-in maxtext wheel; the packages live in its home."""
    host = make_host(disk_mb=512)  # the uv cache on it holds uv itself (the extra deps script installs it)
    folder, seen_as = host.user.home / "standin-packages", f"/home/{host.user.name}/standin-packages"
    packages = make_packages(folder, seen_as)
    build_standin_wheel(folder, packages.deps_file())
    config = host.user.home / ".config" / "uv"
    config.mkdir(parents=True)
    (config / "uv.toml").write_text(f'find-links = ["{seen_as}"]\n')
    host.own(host.user.home)
    return host, packages


def provision(host, *args: str, timeout: int = 900):
    return host.invoke("provision", "--var", f"maxtext_spec={SPEC}", "--var", "extra_deps=true", *args, timeout=timeout)


def steps(result) -> dict[str, dict]:
    return {step["step"]: step for step in json.loads(result.stdout)["hosts"][0]["steps"]}


INSTALLED = """
import importlib.metadata, json
for name in ("google-tunix", "tpu-inference", "vllm", "maxtext_vllm_adapter", "maxtext-standin"):
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        print(json.dumps([name, None, ""]))
        continue
    print(json.dumps([name, dist.version, dist.read_text("direct_url.json") or ""]))
"""


def installed(host) -> dict[str, tuple[str | None, str]]:
    """name -> (version or None, direct_url.json) in the host's venv."""
    done = host.run_as_user(f"~/maxtext_venv/bin/python - <<'EOF'\n{INSTALLED}\nEOF")
    assert done.returncode == 0, done.stderr
    return {name: (version, origin) for name, version, origin in map(json.loads, done.stdout.splitlines())}


def test_extra_deps_install_at_their_commits_and_a_changed_commit_or_missing_adapter_is_repaired(standin_host):
    host, packages = standin_host
    first = provision(host, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert statuses(first)["MaxText"] == "changed" and statuses(first)[EXTRA_DEPS] == "changed"
    found = installed(host)
    for name, commits in packages.commits.items():
        assert found[name][0] == "0.1.1" and commits[0] in found[name][1]
    assert found["maxtext_vllm_adapter"][0] == "0.1.0" and found["maxtext-standin"][0] == "0.2.3"

    again = provision(host, "--json")
    assert again.returncode == 0 and set(statuses(again).values()) == {"ok", "skipped"}, again.stdout

    moved = host.run_as_user(
        "~/.local/bin/uv pip install --quiet --python ~/maxtext_venv --no-deps "
        f"--no-build-isolation 'vllm @ {packages.urls['vllm'][1]}'"
    )
    assert moved.returncode == 0, moved.stderr
    checked = provision(host, "--check", "--json")
    assert steps(checked)[EXTRA_DEPS]["status"] == "changed"
    assert steps(checked)[EXTRA_DEPS]["output"] == f"vllm is not installed at commit {packages.commits['vllm'][0]}"

    removed = host.run_as_user("~/.local/bin/uv pip uninstall --quiet --python ~/maxtext_venv maxtext_vllm_adapter")
    assert removed.returncode == 0, removed.stderr
    checked = provision(host, "--check", "--json")
    assert "maxtext_vllm_adapter" in steps(checked)[EXTRA_DEPS]["output"]

    repaired = provision(host, "--json")
    assert repaired.returncode == 0 and statuses(repaired)[EXTRA_DEPS] == "changed", repaired.stdout
    found = installed(host)
    assert packages.commits["vllm"][0] in found["vllm"][1] and found["maxtext_vllm_adapter"][0] == "0.1.0"


def test_a_venv_rebuilt_from_the_lock_has_the_commit_pinned_packages_and_the_adapter(standin_host, tmp_path):
    """A new boot disk: the venv is gone, the lock (and the caches on the data disk) remain."""
    host, packages = standin_host
    first = provision(host, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    lock = tmp_path / "host.lock.txt"
    frozen = host.invoke("freeze", "--lock", str(lock), vars=False)
    assert frozen.returncode == 0, frozen.stderr
    text = lock.read_text()
    assert f"\nvllm @ {packages.urls['vllm'][0]}\n" in text
    assert f"\ngoogle-tunix @ {packages.urls['google-tunix'][0]}\n" in text
    assert "\nmaxtext-vllm-adapter @ file://" in text and "\nmaxtext-standin==0.2.3\n" in text

    assert host.run_as_user("rm -rf ~/maxtext_venv").returncode == 0
    rebuilt = provision(host, "--locked", "--lock", str(lock), "--json")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert statuses(rebuilt)["venv"] == "changed" and statuses(rebuilt)[LOCKED] == "changed"
    assert statuses(rebuilt)[EXTRA_DEPS] == "skipped"

    again = tmp_path / "again.lock.txt"
    assert host.invoke("freeze", "--lock", str(again), vars=False).returncode == 0
    packages_only = [line for line in text.splitlines() if not line.startswith("#")]
    assert [line for line in again.read_text().splitlines() if not line.startswith("#")] == packages_only
    found = installed(host)
    assert packages.commits["vllm"][0] in found["vllm"][1] and found["maxtext_vllm_adapter"][0] == "0.1.0"
    assert set(statuses(provision(host, "--locked", "--lock", str(lock), "--json")).values()) == {"ok", "skipped"}
