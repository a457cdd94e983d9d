"""Checkpoint archives: the tar of a checkpoint directory (docs/ingest-api.md: one uncompressed
tar of a Hugging Face or PEFT directory plus `trainer_state/`), written, hashed and unpacked.

The standard library only, so that the engine checks a `--resume-from` or `--init-from` path
before it loads torch, transformers or peft (engine.checkpoints, which re-exports these, writes
the directories themselves).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tarfile

#: The directory of a checkpoint that holds what a resume needs besides the weights.
STATE_DIR = "trainer_state"


def write_tar(directory: pathlib.Path, archive: pathlib.Path) -> tuple[int, str]:
    """Archive a checkpoint directory as one uncompressed tar; return (size in bytes, sha256 hex).

    Members are relative to the directory (no leading folder), sorted, with fixed owners and
    mtimes so the same checkpoint always gives the same bytes.
    """
    directory, archive = pathlib.Path(directory), pathlib.Path(archive)
    partial = archive.with_name(archive.name + ".partial")

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False, filter=normalise)
    os.replace(partial, archive)
    return archive.stat().st_size, sha256_file(archive)


def sha256_file(path: pathlib.Path) -> str:
    """Return the hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract_tar(archive: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """Unpack a checkpoint tar into `directory` (refusing links and paths that leave it)."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r") as tar:
        tar.extractall(directory, filter="data")
    return directory
