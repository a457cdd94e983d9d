"""Model directories for the model registry's tests, and a local server that speaks the Hugging
Face Hub's download API.

``tiny_model_directory`` saves one of the engine's tiny random models (built from its family's
own transformers config class) as a Hugging Face directory, in about a second; ``tar_directory``
packs a directory as ``lab models push`` does. ``HubServer`` serves directories as Hub
repositories at fixed commits: the model info and revision API (``/api/models/<id>[/revision/
<rev>]``), the file tree (``/api/models/<id>/tree/<rev>``) and each file
(``/<id>/resolve/<rev>/<path>``, HEAD and GET with the Hub's ``X-Repo-Commit``, ``ETag`` and
``X-Linked-Size`` headers), answering an unknown repository or revision with the Hub's
``X-Error-Code``; it records every path it was asked for. ``model_storage`` (a fixture) gives a
test an empty model store.
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


class HubServer:
    """A local stand-in for the Hub's download API (see the module docstring)."""

    def __init__(self):
        self.repositories: dict[str, _Repository] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                server._answer(self, body=False)

            def do_GET(self):
                server._answer(self, body=True)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def add(self, repo_id: str, directory: Path, *, commit: str, revisions: tuple[str, ...] = ("main",)) -> None:
        """Serve ``directory`` as the repository ``repo_id`` at ``commit`` (also under ``revisions``)."""
        self.repositories[repo_id] = _Repository(directory, commit, revisions)

    def __enter__(self) -> HubServer:
        http_server.start(self.http)
        return self

    def __exit__(self, *exc) -> None:
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

    def _find(self, parts: list[str]) -> tuple[str, _Repository | None, list[str]]:
        repo_id = "/".join(parts[:2])
        return repo_id, self.repositories.get(repo_id), parts[2:]

    def _answer(self, handler, *, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        parts = [part for part in path.split("/") if part]
        if parts[:2] == ["api", "models"]:
            repo_id, repository, rest = self._find(parts[2:])
            if repository is None:
                return self._error(handler, "RepoNotFound")
            revision = rest[1] if rest[:1] in (["revision"], ["tree"]) and len(rest) > 1 else "main"
            if revision not in repository.revisions:
                return self._error(handler, "RevisionNotFound")
            if rest[:1] == ["tree"]:
                entries = [
                    {"type": "file", "path": name, "size": (repository.directory / name).stat().st_size,
                     "oid": hashlib.sha1((repository.directory / name).read_bytes()).hexdigest()}
                    for name in repository.files
                ]
                return self._json(handler, entries, body)
            info = {"id": repo_id, "modelId": repo_id, "sha": repository.commit, "private": False,
                    "siblings": [{"rfilename": name} for name in repository.files]}
            return self._json(handler, info, body)
        resolve = parts.index("resolve") if "resolve" in parts else -1
        if resolve != 2 or len(parts) < 5:
            return self._error(handler, "EntryNotFound")
        repo_id, repository, _ = self._find(parts)
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
