"""The builder's downloads from the package index: written to a partial file made anew, checked
against the SHA-256 the index gave, then renamed into place."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

from environments.builder.steps import BuildFailed

_CHUNK = 1024 * 1024


def download(url: str, target: Path, sha256: str) -> None:
    """Download ``url`` to ``target`` (atomically), refusing a body whose SHA-256 is not ``sha256``.
    The partial file is created anew under a random name (``mkstemp``: O_EXCL, so never through a
    link that code of an earlier sandboxed step planted in the build's folder)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    partial = Path(name)
    os.fchmod(descriptor, 0o666 & ~_umask())  # as open() would make it (mkstemp's is 0600): jobs read the wheelhouse
    digest = hashlib.sha256()
    with os.fdopen(descriptor, "wb") as out, urllib.request.urlopen(url, timeout=120) as response:
        while chunk := response.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        partial.unlink()
        raise BuildFailed(f"{target.name} from the index does not have the SHA-256 the index gave for it")
    partial.replace(target)


def _umask() -> int:
    """The process's umask (``/proc/self/status``; 0o022 where it is not there), read without changing it."""
    try:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Umask:"))
        return int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o022
