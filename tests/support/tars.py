"""Uncompressed tars built in memory, shaped like the archives an engine uploads (standard library only)."""

from __future__ import annotations

import io
import tarfile


def tar_of(files: dict[str, bytes]) -> bytes:
    """Return the bytes of an uncompressed tar holding ``files`` (member name → content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
