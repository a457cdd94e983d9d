"""Lab's model store: a model's files in Lab's storage (``lab.storage``) by revision, and what an
engine is handed to fetch them (``engine.model_store``).

A revision's files live under ``models/<owner>/<name>/<revision>/<path>``; the registry row
records them (``Model.files``: path, size in bytes, hex SHA-256) and the prefix. A revision is the
Hub's commit for a model added from a Hugging Face endpoint, else ``content_revision``: the first
16 hex digits of the SHA-256 over the sorted ``path\\0sha256`` lines, so the same files always get
the same revision and storing them again writes nothing. Revisions are never overwritten; a job
that started from one keeps reading it after the model moves on.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.db.models import Q

from jobs.registry.models import Model, ModelStatus
from lab import storage

KEY_PREFIX = "models/"
#: Signed download URLs of a model's files handed to an engine on S3 live this long (seconds):
#: the engine fetches them when its attempt starts, which Kueue may hold back for hours.
DOWNLOAD_URL_EXPIRE_S = 24 * 3600
_CHUNK = 1024 * 1024


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(directory: Path, paths: list[str]) -> list[dict]:
    """Return ``[{"path", "size", "sha256"}]`` for each of ``paths`` (relative to ``directory``), sorted."""
    return [
        {"path": path, "size": (directory / path).stat().st_size, "sha256": file_sha256(directory / path)}
        for path in sorted(paths)
    ]


def content_revision(files: list[dict]) -> str:
    """The revision of a model whose files are ``files`` (``describe_files``): see the module docstring."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda item: item["path"]):
        digest.update(f"{file['path']}\0{file['sha256']}\n".encode())
    return digest.hexdigest()[:16]


def revision_prefix(model_id: str, revision: str) -> str:
    """The storage key prefix of a revision's files (ends with ``/``)."""
    return f"{KEY_PREFIX}{model_id}/{revision}/"


def store_files(directory: Path, files: list[dict], prefix: str) -> int:
    """Put each of ``files`` (``describe_files`` of ``directory``) into storage under ``prefix``;
    return the bytes written. A file already there with the same size is not written again (a
    revision's files never change)."""
    written = 0
    backend = storage.object_storage()
    for file in files:
        key = prefix + file["path"]
        if backend.exists(key) and backend.size(key) == file["size"]:
            continue
        storage.put_file(key, directory / file["path"], content_type="application/octet-stream")
        written += file["size"]
    return written


def file_url(key: str, filename: str) -> str:
    """Where an engine fetches the stored object ``key``: a ``file://`` URL on the filesystem
    backend, else a pre-signed GET URL good for ``DOWNLOAD_URL_EXPIRE_S`` seconds."""
    if storage.is_filesystem():
        return storage.path_of(key).as_uri()
    return storage.download_url(key, filename=filename, content_type="application/octet-stream", expires_s=DOWNLOAD_URL_EXPIRE_S)


def stored_model_manifest(model: Model) -> dict:
    """What ``LAB_JOB_MODEL`` hands an engine for the stored ``model`` (``engine.model_store``):
    ``{"id", "revision", "architecture", "context_length", "parameters", "files": [{"path", "size",
    "sha256", "url"}]}``."""
    return {
        "id": model.id,
        "revision": model.revision,
        "architecture": model.architecture,
        "context_length": model.context_length,
        "parameters": model.parameters,
        "files": [
            {**file, "url": file_url(model.storage_prefix + file["path"], file["path"].rsplit("/", 1)[-1])}
            for file in model.files
        ],
    }


def launch_model(*, model_id: str, organization_id: int) -> dict | None:
    """The ``LAB_JOB_MODEL`` manifest for a job of ``organization_id`` naming ``model_id``, when
    that is a ready stored model it may use (offered to everyone, or its own); None otherwise
    (a built-in or placed directory, which the engine finds in its model cache)."""
    model = (
        Model.objects.filter(Q(organization__isnull=True) | Q(organization_id=organization_id), id=model_id, status=ModelStatus.READY)
        .exclude(files=[]).first()
    )
    return stored_model_manifest(model) if model is not None else None
