"""A stand-in of the Hugging Face Hub's HTTP API, for `invoke publish` and the model download of
`invoke provision` (HF_ENDPOINT points at it).

It answers what huggingface_hub's download path calls (file_download.py, _snapshot_download.py: the
revision's info, the tree, HEAD and ranged GET of /REPO/resolve/REV/PATH with the Hub's X-Repo-Commit,
ETag, X-Linked-Etag and X-Linked-Size headers; a gated repo wants a token) and its upload path
(hf_api.py, _commit_api.py, lfs.py): whoami-v2, repos/create (409 with the url when
the repo exists), model info, the tree listing, preupload (LFS for *.safetensors and files of 10 MiB
or more, regular otherwise, with the oid of the file already there), validate-yaml, the LFS batch
API (no actions for an object already stored), single-part uploads with verify, and the NDJSON
commit. It speaks LFS, not Xet (huggingface_hub uses LFS when hf_xet is not installed). Errors
carry the Hub's X-Error-Code header and JSON `error`. Writes need a token allowed on the namespace
(the user's own, or an organization it writes to). Everything that arrives is recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import yaml

LFS_MIN_BYTES = 10 * 1024 * 1024
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    gated: bool = False
    files: dict[str, dict] = field(default_factory=dict)  # path -> {"data" | "lfs": oid, "size"}
    commits: list[dict] = field(default_factory=list)

    def head(self) -> str:
        return hashlib.sha1(json.dumps(self.commits, sort_keys=True).encode()).hexdigest()


@dataclass
class Hub:
    """The Hub's state and what arrived: tokens -> whoami answers, repos, LFS objects, requests."""

    tokens: dict[str, dict] = field(default_factory=dict)
    repos: dict[str, Repo] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)  # LFS oids whose bytes arrived
    refused_names: dict[str, str] = field(default_factory=dict)  # repo id -> the Hub's error message
    refused_commit: str | None = None  # the Hub's error message for any commit (422), as for a rejected one
    authorizations: set[str] = field(default_factory=set)
    tampered: set[str] = field(default_factory=set)  # paths served with other bytes than their checksum's
    url: str = ""

    def seed(self, repo_id: str, files: dict[str, bytes], gated: bool = True) -> None:
        """A repository as its owner uploaded it: LFS for *.safetensors, *.pth and large files."""
        repo = Repo(private=False, gated=gated)
        for path, data in files.items():
            if path.endswith((".safetensors", ".pth")) or len(data) >= LFS_MIN_BYTES:
                oid = hashlib.sha256(data).hexdigest()
                self.lfs[oid] = data
                repo.files[path] = {"lfs": oid, "size": len(data)}
            else:
                repo.files[path] = {"data": data, "size": len(data)}
        repo.commits.append({"summary": "upload", "files": sorted(files)})
        self.repos[repo_id] = repo

    def file_bytes(self, repo_id: str, path: str) -> bytes:
        entry = self.repos[repo_id].files[path]
        return self.lfs[entry["lfs"]] if "lfs" in entry else entry["data"]

    def may_write(self, token: str | None, namespace: str) -> bool:
        who = self.tokens.get(token or "")
        if who is None or who["auth"]["accessToken"]["role"] == "read":
            return False
        orgs = {org["name"]: org["roleInOrg"] for org in who.get("orgs", [])}
        return namespace == who["name"] or orgs.get(namespace) in ("admin", "write", "contributor")


def whoami(name: str, role: str = "write", orgs: dict[str, str] | None = None, scoped: list | None = None) -> dict:
    """A whoami-v2 answer as the Hub gives it for an access token."""
    token = {"displayName": f"{name}-token", "role": role}
    if role == "fineGrained":
        token["fineGrained"] = {"canReadGatedRepos": True, "global": [], "scoped": scoped or []}
    return {
        "type": "user",
        "name": name,
        "fullname": name.title(),
        "orgs": [{"name": org, "roleInOrg": org_role} for org, org_role in (orgs or {}).items()],
        "auth": {"type": "access_token", "accessToken": token},
    }


class Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"
    #: Headers and body in separate writes would each wait out the client's delayed ACK (40 ms on Linux);
    #: Go's servers (the API server's) and the Hub's set TCP_NODELAY too
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    # ------------------------------------------------------------ plumbing

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        if token:
            self.hub.authorizations.add(token)
        return token

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, payload=None, error_code: str | None = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(payload if payload is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, message: str, error_code: str | None = None) -> None:
        self._send(status, {"error": message}, error_code)

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return None
        if repo.private and not self.hub.may_write(self._token(), repo_id.split("/")[0]):
            return None
        return repo

    def _info(self, repo_id: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return self._error(404, "Repository not found", "RepoNotFound")
        self._send(
            200,
            {
                "id": repo_id,
                "modelId": repo_id,
                "private": repo.private,
                "sha": repo.head(),
                "siblings": [{"rfilename": path} for path in sorted(repo.files)],
                "tags": [],
            },
        )

    # ------------------------------------------------------------ routes

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        self.hub.requests.append(("GET", path))
        if self._resolve(head=False):
            return
        if path == "/api/whoami-v2":
            who = self.hub.tokens.get(self._token() or "")
            return self._send(200, who) if who else self._error(401, "Invalid credentials in Authorization header")
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
            return self._info(match[1])
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+(?:/(.*))?", path):
            repo = self._repo(match[1])
            if repo is None:
                return self._error(404, "Repository not found", "RepoNotFound")
            entries = []
            for name, entry in sorted(repo.files.items()):
                data = self.hub.lfs[entry["lfs"]] if "lfs" in entry else entry["data"]
                item = {
                    "type": "file",
                    "path": name,
                    "size": entry["size"],
                    "oid": git_blob_id(data if "lfs" not in entry else pointer(entry["lfs"], entry["size"])),
                }
                if "lfs" in entry:
                    item["lfs"] = {
                        "oid": entry["lfs"],
                        "size": entry["size"],
                        "pointerSize": len(pointer(entry["lfs"], entry["size"])),
                    }
                entries.append(item)
            return self._send(200, entries)
        self._error(404, f"no route {path}")

    def _resolve(self, head: bool) -> bool:
        """HEAD or GET /REPO/resolve/REVISION/PATH: a file's bytes (from a byte offset with Range)."""
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", urlparse(self.path).path)
        if not match:
            return False
        repo = self._repo(match[1])
        entry = repo.files.get(match[2]) if repo else None
        if repo is None or entry is None:
            self._error(404, "Entry not found", "EntryNotFound" if repo else "RepoNotFound")
            return True
        token = self._token()  # recorded whether the repository asks for one or not
        if repo.gated and token not in self.hub.tokens:
            self._error(
                401,
                f"Access to model {match[1]} is restricted. You must have access to it and be "
                "authenticated to access it.",
                "GatedRepo",
            )
            return True
        data = self.hub.lfs[entry["lfs"]] if "lfs" in entry else entry["data"]
        if match[2] in self.hub.tampered:
            data = bytes(byte ^ 1 for byte in data)
        start = int(re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "bytes=0-"))[1])
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Repo-Commit", repo.head())
        if "lfs" in entry:
            self.send_header("ETag", f'"{entry["lfs"]}"')
            self.send_header("X-Linked-Etag", f'"{entry["lfs"]}"')
            self.send_header("X-Linked-Size", str(len(data)))
        else:
            self.send_header("ETag", f'"{git_blob_id(data)}"')
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(data[start:])
        return True

    def do_HEAD(self) -> None:
        self.hub.requests.append(("HEAD", urlparse(self.path).path))
        if not self._resolve(head=True):
            self._error(404, "no route")

    def do_PUT(self) -> None:
        path = urlparse(self.path).path
        self.hub.requests.append(("PUT", path))
        if match := re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path):
            data = self._body()
            if hashlib.sha256(data).hexdigest() != match[1]:
                return self._error(400, "the content does not match its oid")
            self.hub.lfs[match[1]] = data
            self.hub.uploads.append(match[1])
            return self._send(200, raw=b"")
        self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        path = urlparse(self.path).path
        self.hub.requests.append(("POST", path))
        body = self._body()
        token = self._token()
        if path == "/api/repos/create":
            request = json.loads(body)
            repo_id = (
                f"{request.get('organization') or self.hub.tokens.get(token or '', {}).get('name')}/{request['name']}"
            )
            if not self.hub.may_write(token, repo_id.split("/")[0]):
                return self._error(403, "You don't have the rights to create a model under the namespace")
            if repo_id in self.hub.refused_names:
                return self._error(400, self.hub.refused_names[repo_id])
            if repo_id in self.hub.repos:
                return self._send(
                    409, {"error": "You already created this model repo", "url": f"{self.hub.url}/{repo_id}"}
                )
            # huggingface_hub 2.x sends `visibility`, 1.x `private`
            repo = Repo(private=request.get("visibility") == "private" or bool(request.get("private")))
            repo.files[".gitattributes"] = {"data": GITATTRIBUTES, "size": len(GITATTRIBUTES)}
            repo.commits.append({"summary": "initial commit", "files": [".gitattributes"]})
            self.hub.repos[repo_id] = repo
            return self._send(200, {"url": f"{self.hub.url}/{repo_id}", "name": repo_id, "id": repo_id})
        if path == "/api/validate-yaml":
            content = json.loads(body)["content"]
            match = re.match(r"---\n(.*?)\n---\n", content, re.S)
            try:
                metadata = yaml.safe_load(match[1]) if match else None
            except yaml.YAMLError as error:
                return self._send(400, {"errors": [{"message": str(error)}]})
            if not isinstance(metadata, dict):
                return self._send(200, {"warnings": [{"message": "empty or missing yaml metadata in repo card"}]})
            return self._send(200, {"warnings": []})
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/[^/]+", path):
            repo = self._repo(match[1])
            if repo is None:
                return self._error(404, "Repository not found", "RepoNotFound")
            files = []
            for item in json.loads(body)["files"]:
                lfs = item["path"].endswith(".safetensors") or item["size"] >= LFS_MIN_BYTES
                have = repo.files.get(item["path"])
                oid = None
                if have is not None:
                    oid = have["lfs"] if "lfs" in have else git_blob_id(have["data"])
                files.append(
                    {"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
                )
            return self._send(200, {"files": files, "commitOid": repo.head()})
        if match := re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path):
            if not self.hub.may_write(token, match[1].split("/")[0]):
                return self._error(403, "no write access")
            objects = []
            for item in json.loads(body)["objects"]:
                entry = {"oid": item["oid"], "size": item["size"]}
                if item["oid"] not in self.hub.lfs:
                    entry["actions"] = {
                        "upload": {"href": f"{self.hub.url}/lfs-upload/{item['oid']}"},
                        "verify": {"href": f"{self.hub.url}/lfs-verify"},
                    }
                objects.append(entry)
            return self._send(200, {"transfer": "basic", "objects": objects})
        if path == "/lfs-verify":
            item = json.loads(body)
            stored = self.hub.lfs.get(item["oid"])
            return (
                self._send(200) if stored is not None and len(stored) == item["size"] else self._error(404, "missing")
            )
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/[^/]+", path):
            repo_id = match[1]
            repo = self._repo(repo_id)
            if repo is None:
                return self._error(404, "Repository not found", "RepoNotFound")
            if not self.hub.may_write(token, repo_id.split("/")[0]):
                return self._error(403, "no write access")
            if self.hub.refused_commit:
                return self._error(422, self.hub.refused_commit)
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            header, changed = lines[0]["value"], []
            for line in lines[1:]:
                value = line["value"]
                if line["key"] == "file":
                    data = base64.b64decode(value["content"])
                    repo.files[value["path"]] = {"data": data, "size": len(data)}
                elif line["key"] == "lfsFile":
                    if value["oid"] not in self.hub.lfs:
                        return self._error(400, f"LFS object {value['oid']} was never uploaded")
                    repo.files[value["path"]] = {"lfs": value["oid"], "size": value["size"]}
                changed.append(value["path"])
            repo.commits.append({"summary": header["summary"], "files": changed})
            oid = repo.head()
            return self._send(
                200, {"commitUrl": f"{self.hub.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
            )
        self._error(404, f"no route {path}")


def pointer(oid: str, size: int) -> bytes:
    """The git-lfs pointer file a stored LFS object stands for in the repo."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


class HubServer:
    """The stand-in Hub on 127.0.0.1, in a thread of the test process."""

    def __init__(self) -> None:
        self.hub = Hub()
        handler = type("BoundHandler", (Handler,), {"hub": self.hub})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.hub.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Hub:
        self.thread.start()
        return self.hub

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
