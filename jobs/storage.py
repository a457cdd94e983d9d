"""Where checkpoint archives live: the ``checkpoints`` entry of Django's STORAGES.

The filesystem under ``LAB_DATA_DIR/checkpoints`` by default; an S3-compatible bucket through
django-storages when ``LAB_STORAGE_URL`` is ``s3://bucket/prefix`` (lab/settings.py). Keys look
like ``<job public id>/<checkpoint public id>.tar``. An engine on the filesystem backend writes the
archive straight to ``upload_target(key)["path"]``; on S3 it PUTs it to a pre-signed URL. Either
way Lab then re-hashes what is stored (``stored_size_and_sha256``).

This module only moves bytes; what a checkpoint row may do is decided in ``jobs.checkpoints``.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage, storages

_CHUNK = 1024 * 1024
ARCHIVE_CONTENT_TYPE = "application/x-tar"


def checkpoint_storage() -> Storage:
    """Return the storage backend that holds checkpoint archives."""
    return storages["checkpoints"]


def is_filesystem() -> bool:
    """Return True when archives are files on this machine (the default backend)."""
    return isinstance(checkpoint_storage(), FileSystemStorage)


def checkpoint_key(job_public_id: str, checkpoint_public_id: str) -> str:
    """Return the storage key of a checkpoint archive."""
    return f"{job_public_id}/{checkpoint_public_id}.tar"


def path_of(key: str) -> Path:
    """Return the file path of ``key`` on the filesystem backend (keys never leave its root).

    Raises ValueError for a key that would escape the root, and for an object store, which has
    no local paths.
    """
    storage = checkpoint_storage()
    if not isinstance(storage, FileSystemStorage):
        raise ValueError("checkpoint storage is an object store: its archives have no local path")
    root = Path(storage.location).resolve()
    path = (root / key).resolve()
    if root not in path.parents:
        raise ValueError(f"storage key escapes the storage root: {key!r}")
    return path


def upload_target(key: str) -> dict[str, Any]:
    """Return the ingest API's upload target for ``key`` (DESIGN.md §4 "Ingest API").

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
    """Return a pre-signed GET URL of ``key`` on S3, good for ``expires_s`` seconds, that saves as ``filename``.

    Raises ValueError on the filesystem backend, which serves archives itself.
    """
    storage = checkpoint_storage()
    if isinstance(storage, FileSystemStorage):
        raise ValueError("the filesystem backend has no signed URLs")
    return _s3_client(storage).generate_presigned_url(
        "get_object",
        Params={
            "Bucket": storage.bucket_name,
            "Key": _s3_object_key(storage, key),
            "ResponseContentDisposition": f'attachment; filename="{filename}"',
            "ResponseContentType": ARCHIVE_CONTENT_TYPE,
        },
        ExpiresIn=expires_s,
    )


def open_archive(key: str):
    """Open the stored object at ``key`` for reading in binary; raise FileNotFoundError when absent."""
    storage = checkpoint_storage()
    if not storage.exists(key):
        raise FileNotFoundError(key)
    return storage.open(key, "rb")


def stored_size_and_sha256(key: str, *, expected_size: int | None = None) -> tuple[int, str] | None:
    """Return (size in bytes, hex SHA-256) of what is stored at ``key``, or None when absent.

    Reads the whole object (on S3: downloads it), so the answer is about the stored bytes, not
    about what the uploader claims. When the stored size differs from ``expected_size`` the
    bytes are not read and the SHA-256 is ``""``.
    """
    storage = checkpoint_storage()
    if not storage.exists(key):
        return None
    if expected_size is not None:
        size = storage.size(key)
        if size != expected_size:
            return size, ""
    digest = hashlib.sha256()
    size = 0
    with storage.open(key, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def delete(key: str) -> None:
    """Delete the object at ``key``; a missing one is not an error."""
    checkpoint_storage().delete(key)


def iter_objects() -> Iterator[tuple[str, datetime]]:
    """Yield ``(key, last modified (UTC))`` for every stored object, in no particular order.

    Unfinished local uploads (``*.partial``) are objects too: the orphan sweep's grace period
    protects them while they are young.
    """
    storage = checkpoint_storage()
    if isinstance(storage, FileSystemStorage):
        root = Path(storage.location)
        if not root.is_dir():
            return
        for path in root.rglob("*"):
            if path.is_file():
                modified = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
                yield path.relative_to(root).as_posix(), modified
        return
    prefix = _s3_object_key(storage, "")
    for item in storage.bucket.objects.filter(Prefix=prefix):
        yield item.key[len(prefix):], item.last_modified


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


def _s3_client(storage: Storage):
    return storage.connection.meta.client


def _s3_object_key(storage: Storage, key: str) -> str:
    """Return the bucket key of storage ``key`` (the ``LAB_STORAGE_URL`` prefix, then the key)."""
    location = storage.location.strip("/")
    return f"{location}/{key}" if location else key
