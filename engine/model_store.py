"""A model from Lab's model store, fetched into this machine's model cache before a job uses it.

Lab hands a job whose model it stores (``manage.py models add``, ``lab models push``;
docs/models.md) the model's files in ``LAB_JOB_MODEL``, one JSON object:
``{"id", "revision", "architecture", "context_length", "parameters", "files": [{"path", "size",
"sha256", "url"}]}``, each ``url`` ``file://`` on a machine that shares Lab's storage, else a
pre-signed HTTPS URL (no credential of Lab's). ``fetch_model`` copies them into
``<model cache>/.store/<owner>/<name>/<revision>/``, checking each file's size and SHA-256,
once per machine (where the model cache is mounted read-only without that revision, as the
pool's model volume may be, into ``$TMPDIR/lab-models`` of the pod instead): a file lock makes concurrent jobs fetch once, and the directory appears whole
(a rename) or not at all. ``prepare_job_model`` then adds the model to the engine's catalogue
(``engine.catalog.register_stored_model``), so ``engine.models`` loads it from there. Nothing
is ever fetched from a model hub.

Imports the standard library, httpx and filelock only (no torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass

import filelock
import httpx

from engine.catalog import ModelInfo, register_stored_model
from engine.config import default_model_dir, environment

#: The variable that hands the engine its stored model.
MODEL_VARIABLE = "LAB_JOB_MODEL"
#: Seconds one file's download may stall before it fails.
FETCH_TIMEOUT_S = 60
_CHUNK = 1024 * 1024


class StoredModelError(Exception):
    """The stored model cannot be used: a malformed ``LAB_JOB_MODEL`` or a file whose bytes are
    not those Lab recorded (``retryable`` False: a job error), or storage that could not be
    reached (``retryable``: the attempt crashes and Lab tries again)."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class StoredFile:
    """One file of a stored model: its path in the model's directory, size (bytes), SHA-256 and URL."""

    path: str
    size: int
    sha256: str
    url: str


@dataclass(frozen=True)
class StoredModel:
    """A stored model as ``LAB_JOB_MODEL`` describes it."""

    id: str
    revision: str
    architecture: str
    context_length: int
    parameters: int | None
    files: tuple[StoredFile, ...]

    @classmethod
    def from_json(cls, text: str) -> StoredModel:
        """Parse ``LAB_JOB_MODEL``; raises StoredModelError when it is not of the documented shape
        or a path would leave the model's directory."""
        try:
            data = json.loads(text)
            files = tuple(
                StoredFile(path=str(item["path"]), size=int(item["size"]), sha256=str(item["sha256"]), url=str(item["url"]))
                for item in data["files"]
            )
            model = cls(
                id=str(data["id"]), revision=str(data["revision"]), architecture=str(data.get("architecture") or ""),
                context_length=int(data["context_length"]), parameters=data.get("parameters"), files=files,
            )
        except (ValueError, KeyError, TypeError) as error:
            raise StoredModelError(f"{MODEL_VARIABLE} is not a stored model: {error}") from None
        for part in (*model.id.split("/"), model.revision, *(part for file in files for part in file.path.split("/"))):
            if part in ("", ".", "..") or "\\" in part:
                raise StoredModelError(f"{MODEL_VARIABLE} names a path that leaves the model cache: {model.id}, {model.revision}")
        if model.id.count("/") != 1 or not files:
            raise StoredModelError(f"{MODEL_VARIABLE} names no files, or an id that is not <owner>/<name>: {model.id!r}")
        return model


def cache_path(model: StoredModel, model_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Return where ``model``'s revision lives in the model cache (``model_dir``, default
    ``LAB_MODEL_DIR``)."""
    return (model_dir or default_model_dir()) / ".store" / model.id / model.revision


def _writable(path: pathlib.Path) -> bool:
    """Whether files can be created at ``path`` (its nearest existing folder is writable)."""
    while not path.exists():
        path = path.parent
    return os.access(path, os.W_OK)


def _refusal(file: StoredFile, status: int, body: bytes) -> str:
    """What an HTTP ``status`` other than 200 from ``file``'s signed URL means, for the job's
    error; ``body`` is the start of the answer, whose S3 error code (``<Code>``) is named."""
    found = re.search(rb"<Code>([A-Za-z]{1,64})</Code>", body)
    answer = f"HTTP {status} {found.group(1).decode()}" if found else f"HTTP {status}"
    if status == 404:
        return f"{file.path}: the object is missing from Lab's storage ({answer})"
    if status == 403:
        # S3 answers 403, not 404, for a missing object when the URL's signer may not list the bucket.
        return f"{file.path}: storage refused its signed URL: the object is missing, or the URL expired ({answer})"
    return f"{file.path}: storage answered {answer}"


def _copy(file: StoredFile, target: pathlib.Path) -> None:
    """Write ``file``'s bytes to ``target`` and check their size and SHA-256."""
    digest, size = hashlib.sha256(), 0
    with target.open("wb") as handle:
        if file.url.startswith("file:"):
            source = pathlib.Path(urllib.request.url2pathname(urllib.parse.urlsplit(file.url).path))
            try:
                reader = source.open("rb")
            except OSError as error:
                raise StoredModelError(f"{file.path}: Lab's storage does not hold it: {error}") from None
            with reader:
                while chunk := reader.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    handle.write(chunk)
        else:
            try:
                with httpx.stream("GET", file.url, timeout=FETCH_TIMEOUT_S, follow_redirects=False) as response:
                    if response.status_code != 200:
                        try:
                            body = next(response.iter_bytes(4096), b"")
                        except httpx.HTTPError:
                            body = b""
                        raise StoredModelError(_refusal(file, response.status_code, body), retryable=response.status_code >= 500)
                    for chunk in response.iter_bytes(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        handle.write(chunk)
            except httpx.HTTPError as error:
                raise StoredModelError(f"{file.path}: cannot fetch it from storage: {error}", retryable=True) from None
    if size != file.size or digest.hexdigest() != file.sha256:
        raise StoredModelError(f"{file.path}: the stored bytes are not those Lab recorded (size {size}, expected {file.size}; SHA-256 differs)")


def fetch_model(model: StoredModel, model_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Return the directory of ``model`` in the model cache, fetching its files first unless a
    job on this machine did (see the module docstring). Raises StoredModelError."""
    target = cache_path(model, model_dir)
    if target.is_dir():
        return target
    if not _writable(target.parent):
        # A model cache mounted read-only (the pool's model volume) that lacks this revision: the
        # pod fetches it into a cache of its own.
        target = cache_path(model, pathlib.Path(tempfile.gettempdir()) / "lab-models")
        if target.is_dir():
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(target.parent / f".{model.revision}.lock")):
        if target.is_dir():
            return target
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{model.revision}.", dir=target.parent))
        try:
            for file in model.files:
                destination = staging / file.path
                destination.parent.mkdir(parents=True, exist_ok=True)
                _copy(file, destination)
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared by jobs
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def prepare_job_model(model_dir: pathlib.Path | None = None, environ=None) -> pathlib.Path | None:
    """Fetch the stored model ``LAB_JOB_MODEL`` names (when set) and add it to the engine's
    catalogue; return its directory, or None without one. Raises StoredModelError."""
    text = (environment() if environ is None else environ).get(MODEL_VARIABLE, "")
    if not text:
        return None
    model = StoredModel.from_json(text)
    path = fetch_model(model, model_dir)
    register_stored_model(
        ModelInfo(
            id=model.id, context_length=model.context_length, parameters=model.parameters,
            description=f"Stored model, revision {model.revision}.", source="store", architecture=model.architecture or None,
        ),
        path,
    )
    return path
