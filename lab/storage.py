"""Lab's object storage: the ``checkpoints`` entry of Django's STORAGES, for every stored object.

The filesystem under ``LAB_DATA_DIR/checkpoints`` by default; an S3-compatible bucket through
django-storages when ``LAB_STORAGE_URL`` is ``s3://bucket/prefix`` (lab/settings.py). Each app
keeps its objects under its own keys: checkpoint archives under ``<job public id>/``
(``jobs.storage``), everything else under one of ``OWNED_PREFIXES``. This module only moves
bytes by key; what an object is and who may read it is decided by the app that owns it.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from django.core.files.storage import FileSystemStorage, Storage, storages

_CHUNK = 1024 * 1024

#: The key prefixes of the objects that are not checkpoint archives, and what each holds; every
#: app's keys but checkpoints' (``<job public id>/``, which never starts with one of these) begin
#: with one of them, so the checkpoint orphan sweep (``jobs.storage.iter_objects``) can leave
#: them alone without knowing the apps. A new kind of object takes its prefix here.
OWNED_PREFIXES = {
    "environments/": "environment packages, builds and datasets (environments.storage)",
    "models/": "the model store's files, pushed archives and check logs (jobs.registry.store)",
    "sandboxes/": "what ended sandboxes printed (sandboxes.kept_logs)",
}


def object_storage() -> Storage:
    """Return the storage backend that holds Lab's objects (checkpoints, environment packages)."""
    return storages["checkpoints"]


def is_filesystem() -> bool:
    """Return True when objects are files on this machine (the default backend)."""
    return isinstance(object_storage(), FileSystemStorage)


def path_of(key: str) -> Path:
    """Return the file path of ``key`` on the filesystem backend (keys never leave its root).

    Raises ValueError for a key that would escape the root, and for an object store, which has
    no local paths.
    """
    storage = object_storage()
    if not isinstance(storage, FileSystemStorage):
        raise ValueError("storage is an object store: its objects have no local path")
    root = Path(storage.location).resolve()
    path = (root / key).resolve()
    if root not in path.parents:
        raise ValueError(f"storage key escapes the storage root: {key!r}")
    return path


def open_object(key: str) -> IO[bytes]:
    """Open the stored object at ``key`` for reading in binary; raise FileNotFoundError when absent."""
    storage = object_storage()
    if not storage.exists(key):
        raise FileNotFoundError(key)
    return storage.open(key, "rb")


def read_text(key: str) -> str:
    """The stored object at ``key`` as UTF-8 text (undecodable bytes replaced); ``""`` when it is
    absent or ``key`` is empty (a log not written yet)."""
    if not key:
        return ""
    try:
        with open_object(key) as handle:
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def stored_size_and_sha256(key: str, *, expected_size: int | None = None) -> tuple[int, str] | None:
    """Return (size in bytes, hex SHA-256) of what is stored at ``key``, or None when absent.

    Reads the whole object (on S3: downloads it), so the answer is about the stored bytes, not
    about what the uploader claims. When the stored size differs from ``expected_size`` the
    bytes are not read and the SHA-256 is ``""``.
    """
    storage = object_storage()
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


def put_file(key: str, source: Path, *, content_type: str) -> None:
    """Store the local file ``source`` at ``key``, replacing what is there."""
    with source.open("rb") as handle:
        put_stream(key, handle, content_type=content_type)


def put_stream(key: str, handle: IO[bytes], *, content_type: str) -> None:
    """Store the bytes read from ``handle`` (from its current position) at ``key``, replacing
    what is there. On the filesystem they are written aside and renamed into place, so a reader
    never sees half an object."""
    storage = object_storage()
    if isinstance(storage, FileSystemStorage):
        target = path_of(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{uuid.uuid4().hex}.partial")
        with partial.open("wb") as writer:
            shutil.copyfileobj(handle, writer, _CHUNK)
        partial.replace(target)
        return
    s3_client(storage).upload_fileobj(
        handle, storage.bucket_name, s3_object_key(storage, key), ExtraArgs={"ContentType": content_type}
    )


def delete(key: str) -> None:
    """Delete the object at ``key``; a missing one is not an error."""
    object_storage().delete(key)


def download_url(key: str, *, filename: str, content_type: str, expires_s: int = 300) -> str:
    """Return a pre-signed GET URL of ``key`` on S3, good for ``expires_s`` seconds, that saves as
    ``filename`` with ``content_type``.

    Raises ValueError on the filesystem backend, which has no signed URLs (Lab serves files itself).
    """
    storage = object_storage()
    if isinstance(storage, FileSystemStorage):
        raise ValueError("the filesystem backend has no signed URLs")
    return s3_client(storage).generate_presigned_url(
        "get_object",
        Params={
            "Bucket": storage.bucket_name,
            "Key": s3_object_key(storage, key),
            "ResponseContentDisposition": f'attachment; filename="{filename}"',
            "ResponseContentType": content_type,
        },
        ExpiresIn=expires_s,
    )


def iter_objects(prefix: str = "") -> Iterator[tuple[str, datetime]]:
    """Yield ``(key, last modified (UTC))`` for every stored object whose key starts with
    ``prefix``, in no particular order. Unfinished local writes (``*.partial``) are objects too."""
    storage = object_storage()
    if isinstance(storage, FileSystemStorage):
        root = Path(storage.location)
        if not root.is_dir():
            return
        for path in root.rglob("*"):
            if path.is_file():
                key = path.relative_to(root).as_posix()
                if key.startswith(prefix):
                    yield key, datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        return
    bucket_prefix = s3_object_key(storage, "")
    for item in storage.bucket.objects.filter(Prefix=bucket_prefix + prefix):
        yield item.key[len(bucket_prefix):], item.last_modified


def s3_client(storage: Storage):
    """Return the boto3 client behind an S3 storage backend."""
    return storage.connection.meta.client


def s3_object_key(storage: Storage, key: str) -> str:
    """Return the bucket key of storage ``key`` (the ``LAB_STORAGE_URL`` prefix, then the key)."""
    location = storage.location.strip("/")
    return f"{location}/{key}" if location else key
