"""Where environment wheels live: Lab's object storage (``lab.storage``), under ``environments/``.

Keys look like ``environments/<organization public id>/<sha256>/<wheel file name>``: the bytes
decide the key, so a stored package is never overwritten by other bytes.
"""

from __future__ import annotations

#: The prefix of every environment package key; checkpoint listings leave these keys out.
KEY_PREFIX = "environments/"
WHEEL_CONTENT_TYPE = "application/zip"


def package_key(*, organization_public_id: str, sha256: str, filename: str) -> str:
    """Return the storage key of a wheel (``filename`` is already checked: no ``/``, ends ``.whl``)."""
    return f"{KEY_PREFIX}{organization_public_id}/{sha256}/{filename}"
