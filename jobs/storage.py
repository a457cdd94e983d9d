"""Where checkpoint archives live. The filesystem under ``LAB_DATA_DIR/checkpoints`` for now.

Keys look like ``<job public id>/<checkpoint public id>.tar``. Engines on the same machine write
the archive straight to ``upload_target(key)["path"]``; Lab then re-hashes what is stored.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from django.conf import settings

_CHUNK = 1024 * 1024


def storage_root() -> Path:
    """Return the directory that holds checkpoint archives."""
    return Path(settings.LAB_DATA_DIR) / "checkpoints"


def checkpoint_key(job_public_id: str, checkpoint_public_id: str) -> str:
    """Return the storage key of a checkpoint archive."""
    return f"{job_public_id}/{checkpoint_public_id}.tar"


def path_of(key: str) -> Path:
    """Return the file path of ``key`` (keys never leave the storage root)."""
    root = storage_root().resolve()
    path = (root / key).resolve()
    if root not in path.parents:
        raise ValueError(f"storage key escapes the storage root: {key!r}")
    return path


def upload_target(key: str) -> dict[str, Any]:
    """Return the ingest API's upload target for ``key``: ``{"method": "local", "path": ...}``."""
    path = path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return {"method": "local", "path": str(path)}


def stored_size_and_sha256(key: str) -> tuple[int, str] | None:
    """Return (size in bytes, hex SHA-256) of what is stored at ``key``, or None when absent."""
    path = path_of(key)
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def delete(key: str) -> None:
    """Delete the object at ``key`` if it exists."""
    path_of(key).unlink(missing_ok=True)


def delete_job_objects(job_public_id: str) -> None:
    """Delete every object of one job."""
    directory = storage_root() / job_public_id
    if directory.is_dir():
        shutil.rmtree(directory, ignore_errors=True)
