"""Where checkpoint archives live: Lab's object storage (``lab.storage``), under ``<job public id>/``.

Keys look like ``<job public id>/<checkpoint public id>.tar``. The engine never writes there: it
uploads to the archive's *upload key* (``upload_key(key)``; a local path on the filesystem
backend, a pre-signed PUT URL on S3), and Lab seals the upload (``seal``): it copies it to the
archive key, hashes what it wrote, and deletes the upload. Whoever still holds the upload path or
URL can then change nothing that Lab serves. Environment packages, the model store's files and
the logs of ended sandboxes share the storage under the prefixes of ``lab.storage.OWNED_PREFIXES``;
the checkpoint listing here, and so the orphan sweep, leaves them out.

This module only moves bytes; what a checkpoint or adapter row may do is decided in
``jobs.artifacts.lifecycle``.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import FileSystemStorage
from django.db import transaction

from lab import storage as objects
from lab.storage import delete, is_filesystem, path_of, stored_size_and_sha256
from lab.storage import object_storage as checkpoint_storage
from lab.storage import s3_client as _s3_client
from lab.storage import s3_object_key as _s3_object_key

__all__ = [
    "ARCHIVE_CONTENT_TYPE", "archive_key_of_upload", "checkpoint_key", "checkpoint_storage", "delete",
    "delete_after_commit", "delete_job_objects", "discard_upload", "download_url", "is_filesystem", "iter_objects",
    "open_archive", "path_of", "put_file", "seal", "stored_size_and_sha256", "upload_key", "upload_target",
]

_CHUNK = 1024 * 1024
ARCHIVE_CONTENT_TYPE = "application/x-tar"


def checkpoint_key(job_public_id: str, checkpoint_public_id: str) -> str:
    """Return the storage key of a checkpoint archive."""
    return f"{job_public_id}/{checkpoint_public_id}.tar"


def upload_key(key: str) -> str:
    """Return where the engine uploads the archive of ``key`` before Lab seals it."""
    return key.removesuffix(".tar") + ".upload.tar"


def discard_upload(key: str) -> None:
    """Delete the engine's upload of ``key`` if one is there. A settled archive's completion calls
    it: an exited engine's spool, which Lab delivers, may upload an archive again while the
    engine's own completion is sealing it, and the second completion then finds it settled."""
    delete(upload_key(key))


def delete_after_commit(key: str) -> None:
    """Delete the object at ``key`` once the current transaction commits (the one that dropped
    or failed its row). If that fails the object is an orphan, and the orphan sweep removes it."""
    if key:
        transaction.on_commit(lambda: delete(key))


def archive_key_of_upload(key: str) -> str | None:
    """Return the archive key whose upload ``key`` is, or None when ``key`` is no upload."""
    return key.removesuffix(".upload.tar") + ".tar" if key.endswith(".upload.tar") else None


def seal(key: str, *, expected_size: int | None = None) -> tuple[int, str] | None:
    """Move the engine's upload of ``key`` to ``key`` itself; return (size in bytes, hex SHA-256)
    of what is now stored at ``key``, or None when nothing was uploaded.

    On the filesystem the bytes are copied into a new file while being hashed (a writer still
    holding the upload open cannot reach it); on S3 the object is copied server-side, then the
    copy is read back and hashed. The upload is deleted. When the upload's size differs from
    ``expected_size`` nothing is copied, the upload is deleted and the SHA-256 is ``""``. Sealing
    again after a success (the upload gone, the archive there) hashes the archive.
    """
    storage = checkpoint_storage()
    upload = upload_key(key)
    if not storage.exists(upload):
        return stored_size_and_sha256(key, expected_size=expected_size)
    if expected_size is not None and (size := storage.size(upload)) != expected_size:
        storage.delete(upload)
        return size, ""
    if isinstance(storage, FileSystemStorage):
        sealed = _copy_hashing(path_of(upload), path_of(key))
    else:
        client = _s3_client(storage)
        client.copy(
            {"Bucket": storage.bucket_name, "Key": _s3_object_key(storage, upload)},
            storage.bucket_name,
            _s3_object_key(storage, key),
            ExtraArgs={"ContentType": ARCHIVE_CONTENT_TYPE},
        )
        sealed = stored_size_and_sha256(key)
    storage.delete(upload)
    return sealed


def _copy_hashing(source: Path, destination: Path) -> tuple[int, str]:
    """Copy ``source`` to a new file at ``destination`` (written aside, then renamed into place)
    and return (size, hex SHA-256) of the bytes written."""
    digest = hashlib.sha256()
    size = 0
    partial = destination.with_name(f"{destination.name}.{uuid.uuid4().hex}.sealing")  # one per sealer
    with source.open("rb") as reader, partial.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    partial.replace(destination)
    return size, digest.hexdigest()




def upload_target(key: str) -> dict[str, Any]:
    """Return the ingest API's upload target for ``key`` (docs/ingest-api.md).

    ``{"method": "local", "path": ...}`` on the filesystem; on S3
    ``{"method": "put", "url": <pre-signed PUT URL>, "headers": {"Content-Type": ...}}``, the URL
    good for ``LAB_STORAGE_URL_EXPIRE_S`` seconds.
    """
    storage = checkpoint_storage()
    if isinstance(storage, FileSystemStorage):
        path = path_of(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return {"method": "local", "path": str(path)}
    url = _s3_client(storage).generate_presigned_url(
        "put_object",
        Params={"Bucket": storage.bucket_name, "Key": _s3_object_key(storage, key), "ContentType": ARCHIVE_CONTENT_TYPE},
        ExpiresIn=settings.LAB_STORAGE_URL_EXPIRE_S,
        HttpMethod="PUT",
    )
    return {"method": "put", "url": url, "headers": {"Content-Type": ARCHIVE_CONTENT_TYPE}}


def download_url(key: str, *, filename: str, expires_s: int = 300) -> str:
    """Return a pre-signed GET URL of the archive at ``key`` on S3, good for ``expires_s`` seconds,
    that saves as ``filename``. Raises ValueError on the filesystem backend, which serves archives itself."""
    return objects.download_url(key, filename=filename, content_type=ARCHIVE_CONTENT_TYPE, expires_s=expires_s)


def open_archive(key: str):
    """Open the stored archive at ``key`` for reading in binary; raise FileNotFoundError when absent."""
    return objects.open_object(key)


def put_file(key: str, source: Path) -> None:
    """Store the local file ``source`` at ``key``, replacing what is there (Lab's own upload of an
    archive an engine left behind; ``seal`` then treats it like the engine's)."""
    objects.put_file(key, source, content_type=ARCHIVE_CONTENT_TYPE)


def iter_objects() -> Iterator[tuple[str, datetime]]:
    """Yield ``(key, last modified (UTC))`` for every stored checkpoint object, in no particular order.

    Unfinished local uploads (``*.partial``) are objects too: the orphan sweep's grace period
    protects them while they are young. Objects under ``lab.storage.OWNED_PREFIXES`` (environment
    packages, the model store's, sandboxes' logs) are not checkpoint objects.
    """
    owned = tuple(objects.OWNED_PREFIXES)
    for key, modified in objects.iter_objects():
        if not key.startswith(owned):
            yield key, modified


def delete_job_objects(job_public_id: str) -> None:
    """Delete every object of one job (its ``<job public id>/`` prefix)."""
    storage = checkpoint_storage()
    if isinstance(storage, FileSystemStorage):
        directory = path_of(job_public_id)
        if directory.is_dir():
            shutil.rmtree(directory, ignore_errors=True)
        return
    prefix = _s3_object_key(storage, f"{job_public_id}/")
    storage.bucket.objects.filter(Prefix=prefix).delete()



