"""Model directories for the model registry's tests, and a local server that speaks the Hugging
Face Hub's download API.

``tiny_model_directory`` saves one of the engine's tiny random models (built from its family's
own transformers config class) as a Hugging Face directory, in about a second; ``tar_directory``
packs a directory as ``lab models push`` does. ``HubServer`` serves directories as Hub
repositories at fixed commits: the model info and revision API (``/api/models/<id>[/revision/
<rev>]``), the file tree (``/api/models/<id>/tree/<rev>``) and each file
(``/<id>/resolve/<rev>/<path>``, HEAD and GET with the Hub's ``X-Repo-Commit``, ``ETag`` and
``X-Linked-Size`` headers), answering an unknown repository or revision with the Hub's
``X-Error-Code``; it records every request it was asked (``"GET /path"``). It serves dataset
repositories too (``add(..., repo_type="dataset")``), as the real ``datasets`` library asks for
them: the dataset info (``/api/datasets/<id>[/revision/<rev>]``), the tree (``/api/datasets/<id>/
tree/<rev>[/<folder>]``, recursive or not), ``paths-info`` (``POST /api/datasets/<id>/paths-info/
<rev>``) and each file (``/datasets/<id>/resolve/<rev>/<path>``). ``model_storage`` (a fixture)
gives a test an empty model store.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from engine.catalog import TINY_RANDOM_QWEN3_ID
from engine.models import tiny_random_model
from tests.support import http_server


@pytest.fixture
def model_storage(settings, tmp_path):
    """Give the test an empty object storage directory: the model store starts empty."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "objects")}},
    }


def tiny_model_directory(directory: Path, model_id: str = TINY_RANDOM_QWEN3_ID, *, seed: int = 0) -> Path:
    """Save the tiny random model ``model_id`` (``engine.models.tiny_random_model``) with its
    tokenizer and chat template as a Hugging Face directory at ``directory``; return it."""
    model, tokenizer = tiny_random_model(model_id, seed=seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def tar_directory(directory: Path, target: Path, *, top: str | None = None, gzip: bool = False) -> Path:
    """Pack ``directory``'s files into the tar ``target`` (gzip'd with ``gzip``), under the folder
    ``top`` when given; return ``target``."""
    with tarfile.open(target, "w:gz" if gzip else "w") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                name = path.relative_to(directory).as_posix()
                tar.add(path, arcname=f"{top}/{name}" if top else name)
    return target


class _Repository:
    def __init__(self, directory: Path, commit: str, revisions: tuple[str, ...]):
        self.directory, self.commit, self.revisions = directory, commit, {commit, *revisions}
        self.files = sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file())
        self.folders = sorted({"/".join(name.split("/")[:depth]) for name in self.files for depth in range(1, name.count("/") + 1)})

    def entry(self, name: str) -> dict:
        """The Hub's tree entry of the file or folder ``name``."""
        if name in self.folders:
            return {"type": "directory", "path": name, "oid": hashlib.sha1(name.encode()).hexdigest()}
        data = (self.directory / name).read_bytes()
        return {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}

    def tree(self, folder: str, *, recursive: bool) -> list[dict]:
        """The tree entries under ``folder`` ("" the root): its children, or every descendant with ``recursive``."""
        prefix = f"{folder}/" if folder else ""
        names = [name for name in (*self.folders, *self.files) if name.startswith(prefix)]
        if not recursive:
            names = [name for name in names if "/" not in name[len(prefix):]]
        return [self.entry(name) for name in sorted(names)]


class HubServer:
    """A local stand-in for the Hub's download API (see the module docstring)."""

    def __init__(self):
        self.repositories: dict[str, _Repository] = {}
        self.datasets: dict[str, _Repository] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                server._answer(self, body=False)

            def do_GET(self):
                server._answer(self, body=True)

            def do_POST(self):
                server._answer(self, body=True)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def add(
        self, repo_id: str, directory: Path, *, commit: str, revisions: tuple[str, ...] = ("main",), repo_type: str = "model",
    ) -> None:
        """Serve ``directory`` as the repository ``repo_id`` (a ``model`` or a ``dataset``) at ``commit`` (also under ``revisions``)."""
        (self.datasets if repo_type == "dataset" else self.repositories)[repo_id] = _Repository(directory, commit, revisions)

    def __enter__(self) -> HubServer:
        http_server.start(self.http)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop answering (a hub gone away): every later request is refused at connect. Idempotent."""
        if self.http.socket.fileno() != -1:
            http_server.stop(self.http)

    def _error(self, handler, code: str, status: int = 404) -> None:
        handler.send_response(status)
        handler.send_header("X-Error-Code", code)
        handler.send_header("Content-Type", "application/json")
        payload = json.dumps({"error": code}).encode()
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _json(self, handler, data, body: bool) -> None:
        payload = json.dumps(data).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if body:
            handler.wfile.write(payload)

    def _answer(self, handler, *, body: bool) -> None:
        split = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(split.path)
        self.requests.append(f"{handler.command} {path}")
        parts = [part for part in path.split("/") if part]
        if parts[:2] in (["api", "models"], ["api", "datasets"]):
            repositories = self.datasets if parts[1] == "datasets" else self.repositories
            return self._api(handler, repositories, parts[1], parts[2:], urllib.parse.parse_qs(split.query), body=body)
        if parts[:1] == ["datasets"]:
            return self._resolve(handler, self.datasets, parts[1:], body=body)
        return self._resolve(handler, self.repositories, parts, body=body)

    def _api(self, handler, repositories: dict[str, _Repository], kind: str, parts: list[str], query: dict, *, body: bool) -> None:
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        repository = repositories.get(repo_id)
        if repository is None:
            return self._error(handler, "RepoNotFound")
        revision = rest[1] if rest[:1] in (["revision"], ["tree"], ["paths-info"]) and len(rest) > 1 else "main"
        if revision not in repository.revisions:
            return self._error(handler, "RevisionNotFound")
        if rest[:1] == ["tree"]:
            folder = "/".join(rest[2:])
            if folder and folder not in repository.folders:
                return self._error(handler, "EntryNotFound")
            return self._json(handler, repository.tree(folder, recursive=query.get("recursive") == ["true"]), body)
        if rest[:1] == ["paths-info"]:
            length = int(handler.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(handler.rfile.read(length).decode())
            asked = [name.strip("/") for name in form.get("paths", [])]
            return self._json(handler, [repository.entry(name) for name in asked if name in repository.files or name in repository.folders], body)
        if rest[:1] not in ([], ["revision"]):
            return self._error(handler, "EntryNotFound")
        info = {"id": repo_id, "sha": repository.commit, "private": False, "siblings": [{"rfilename": name} for name in repository.files]}
        if kind == "models":
            info["modelId"] = repo_id
        else:
            info.update({"disabled": False, "gated": False, "cardData": {}, "tags": [], "lastModified": "2026-01-01T00:00:00.000Z"})
        return self._json(handler, info, body)

    def _resolve(self, handler, repositories: dict[str, _Repository], parts: list[str], *, body: bool) -> None:
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(handler, "EntryNotFound")
        repository = repositories.get("/".join(parts[:2]))
        if repository is None:
            return self._error(handler, "RepoNotFound")
        if parts[3] not in repository.revisions:
            return self._error(handler, "RevisionNotFound")
        name = "/".join(parts[4:])
        if name not in repository.files:
            return self._error(handler, "EntryNotFound")
        data = (repository.directory / name).read_bytes()
        handler.send_response(200)
        handler.send_header("X-Repo-Commit", repository.commit)
        handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        handler.send_header("X-Linked-Size", str(len(data)))
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Content-Type", "application/octet-stream")
        handler.end_headers()
        if body:
            handler.wfile.write(data)


def models_add(*args: str) -> dict:
    """Run ``manage.py models add ARGS`` in this process and return the JSON it printed last."""
    out = StringIO()
    call_command("models", "add", *args, stdout=out, stderr=StringIO())
    return json.loads(out.getvalue().strip().splitlines()[-1])
