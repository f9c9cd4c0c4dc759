"""Runs on the TPU host, in the MaxText venv (whose huggingface_hub came with MaxText): the Hub side
of `invoke publish`. The model is uploaded from the host, where it and the token already are; the
laptop sends this file as the program of `python3 -` and reads what it prints. Its data:

    {"command": "check", "repo": REPO, "private": BOOL}
        may the host's token write REPO? then create it if missing: one JSON line
    {"command": "upload", "repo": REPO, "folder": FOLDER}
        upload what the Hub does not hold yet of FOLDER (`~` for the home; listed in its SHA256SUMS), in one
        commit, printing a `tpu-grpo:` line per file sent, and one per file uploaded once the commit holds them all

The token comes from HF_TOKEN in the environment (the job script reads it from the token file),
never from the command line. Standard library at import time, so the laptop can test the parts
that need no Hub (`refusal`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

#: An organization role that may create and write repositories (a `read` member may not).
WRITING_ROLES = ("admin", "write", "contributor")
SUMS = "SHA256SUMS"
CARD = "README.md"
LINE = "tpu-grpo:"


def refusal(whoami: dict, repo_id: str) -> str | None:
    """Why this token may not write `repo_id` (one line with the fix), or None, from the Hub's whoami-v2
    answer: a read token, a namespace that is neither the user nor one of their writing organizations,
    or a fine-grained token without `repo.write` on that namespace (or on the repo itself)."""
    namespace = repo_id.split("/")[0]
    user = whoami.get("name", "?")
    token = whoami.get("auth", {}).get("accessToken", {})
    role = token.get("role")
    new_token = (
        "fix: make a token with write access at https://huggingface.co/settings/tokens, then "
        "HF_TOKEN=hf_... uv run invoke provision --tags token"
    )
    if role == "read":
        return f"the host's Hugging Face token ({token.get('displayName', 'unnamed')}) can only read; {new_token}"
    orgs = {org.get("name"): org.get("roleInOrg") for org in whoami.get("orgs", [])}
    if namespace != user and orgs.get(namespace) not in WRITING_ROLES:
        mine = [user] + sorted(name for name, org_role in orgs.items() if org_role in WRITING_ROLES)
        where = (
            f"{user} is a {orgs[namespace]} member of {namespace}"
            if namespace in orgs
            else f"{namespace} is neither {user} nor one of {user}'s organizations"
        )
        return (
            f"--repo {repo_id}: the token's user may not write there ({where}); fix: --repo "
            f"{mine[0]}/{repo_id.split('/')[1]} (you may write to: {', '.join(mine)})"
        )
    if role == "fineGrained":
        scoped = token.get("fineGrained", {}).get("scoped", [])
        allowed = any(
            "repo.write" in entry.get("permissions", []) and entry.get("entity", {}).get("name") in (namespace, repo_id)
            for entry in scoped
        )
        if not allowed:
            return (
                f"the host's fine-grained Hugging Face token ({token.get('displayName', 'unnamed')}) has no "
                f"write access to repositories of {namespace}; fix: add 'Write access to contents/settings of "
                f"all repos' for {namespace} to it at https://huggingface.co/settings/tokens (or make a write "
                "token and run HF_TOKEN=hf_... uv run invoke provision --tags token)"
            )
    return None


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def check(repo_id: str, private: bool) -> int:
    """Refuse (exit 3, one JSON line) before anything is created, or create the repo if missing."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    api = HfApi()
    try:
        whoami = api.whoami()
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status == 401:
            say(
                error="the Hub refuses the host's Hugging Face token (401: invalid or revoked); fix: make a write "
                "token at https://huggingface.co/settings/tokens, then HF_TOKEN=hf_... uv run invoke "
                "provision --tags token"
            )
            return 3
        raise
    why = refusal(whoami, repo_id)
    if why:
        say(error=why)
        return 3
    try:
        info = api.model_info(repo_id)
        say(user=whoami["name"], created=False, private=bool(info.private))
        return 0
    except RepositoryNotFoundError:
        pass
    try:
        api.create_repo(repo_id, private=private, repo_type="model")
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (400, 422):
            detail = error.server_message or str(error).splitlines()[0]
            say(
                error=f"the Hub refuses the name --repo {repo_id} ({detail}); fix: another name "
                "(letters, digits, '-', '_', '.'; at most 96)"
            )
            return 3
        raise
    say(user=whoami["name"], created=True, private=private)
    return 0


def git_blob_id(path: str) -> str:
    """Git's id of a file's content: what the Hub lists as the `oid` of a file kept outside LFS."""
    with open(path, "rb") as source:
        data = source.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def on_hub(api, repo_id: str) -> dict:
    """Path -> the Hub's file entry, for every file of the repo's main branch."""
    from huggingface_hub.hf_api import RepoFile

    return {entry.path: entry for entry in api.list_repo_tree(repo_id, recursive=True) if isinstance(entry, RepoFile)}


def already_there(entry, path: str, sha256: str) -> bool:
    """Whether the Hub's file is this one: its LFS sha256 (no need to read the file), else its git blob id."""
    if entry is None or entry.size != os.path.getsize(path):
        return False
    if entry.lfs is not None:
        return entry.lfs.sha256 == sha256
    return entry.blob_id == git_blob_id(path)


def upload(repo_id: str, folder: str) -> int:
    """Send the files of `folder` that the Hub does not hold yet, one at a time (a `sent` line after each, for
    the laptop's progress bar), then commit them together: only then does the Hub have them (a small file is
    only sent in the commit), and an `uploaded` line says so for each. A re-run finds them and uploads nothing."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi()
    with open(os.path.join(folder, SUMS)) as listing:
        sums = {line[66:].rstrip("\n"): line[:64] for line in listing if len(line) > 66}
    remote = on_hub(api, repo_id)
    todo = [
        name for name in sorted(sums) if not already_there(remote.get(name), os.path.join(folder, name), sums[name])
    ]
    total = sum(os.path.getsize(os.path.join(folder, name)) for name in todo)
    print(
        f"{LINE} publish {len(todo)} files, {total} bytes, to {repo_id} ({len(sums) - len(todo)} already there)",
        flush=True,
    )
    if not todo:
        print(f"{LINE} nothing to upload: {repo_id} already holds every file", flush=True)
        return 0
    operations = []
    for name in todo:
        operation = CommitOperationAdd(path_in_repo=name, path_or_fileobj=os.path.join(folder, name))
        api.preupload_lfs_files(repo_id, additions=[operation])
        operations.append(operation)
        print(f"{LINE} sent {name} {os.path.getsize(os.path.join(folder, name))}", flush=True)
    commit = api.create_commit(
        repo_id, operations=operations, commit_message=f"tpu-grpo: {os.path.basename(folder.rstrip('/'))}"
    )
    print(f"{LINE} committed {commit.oid} {commit.commit_url}", flush=True)
    for name in todo:
        print(f"{LINE} uploaded {name} {os.path.getsize(os.path.join(folder, name))}", flush=True)
    return 0


def main(given: dict) -> int:
    if given["command"] == "check":
        return check(given["repo"], given["private"])
    return upload(given["repo"], os.path.expanduser(given["folder"]))


if __name__ == "__main__":
    sys.exit(main(json.loads(os.environ["TPU_GRPO_INPUT"])))
