"""A catalogue model's directory as one tar, for a user's own model cache (``GET /models/{id}/archive``).

``lab.checkpoints.load`` in the SDK needs the base model an adapter was trained on; a user of a
hosted Lab has no model cache, so the SDK fetches the model's directory from Lab once. The tar of
``LAB_MODEL_DIR/<owner>/<name>`` is built once per state of that directory and kept at
``LAB_DATA_DIR/cache/model-archives/<owner>/<name>/<fingerprint>.tar`` with its SHA-256 beside it
(``.sha256``): the fingerprint covers every file's path, size and modification time, so a model an
operator replaces gets a new archive and the old one is removed. The tar is deterministic (members
sorted, times, owners and modes fixed), so two requests that build it at once write the same bytes.
Members are the directory's regular files, relative to it; hidden files and folders (``.cache``)
and links that lead out of ``LAB_MODEL_DIR`` are left out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs.specs import installed_models
from lab.errors import LabError, not_found
from lab.models import Organization

_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ModelArchive:
    """A built archive: where it is, its size in bytes and its hex SHA-256."""

    path: Path
    size_bytes: int
    sha256: str

    @property
    def filename(self) -> str:
        """The name it is downloaded as: ``<owner>--<name>.tar``."""
        return f"{self.path.parent.parent.name}--{self.path.parent.name}.tar"


def _members(model_dir: Path, root: Path) -> list[tuple[str, Path, os.stat_result]]:
    """``(name in the tar, file, its stat)`` per regular file under ``model_dir``, sorted by name;
    a symbolic link counts as its target when that is a file inside ``root``."""
    members = []
    for folder, folders, files in os.walk(model_dir):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in files:
            if name.startswith("."):
                continue
            path = Path(folder) / name
            target = path.resolve()
            if not target.is_file() or not target.is_relative_to(root):
                continue
            members.append((path.relative_to(model_dir).as_posix(), target, target.stat()))
    return sorted(members, key=lambda member: member[0])


def _fingerprint(members: list[tuple[str, Path, os.stat_result]]) -> str:
    digest = hashlib.sha256()
    for name, _, stat in members:
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def _write_tar(target: Path, members: list[tuple[str, Path, os.stat_result]]) -> str:
    """Write the deterministic tar of ``members`` to ``target``; return its hex SHA-256."""
    with tarfile.open(target, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path, stat in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = stat.st_size, 0o644, 0
            with path.open("rb") as source:
                tar.addfile(info, source)
    digest = hashlib.sha256()
    with target.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def model_archive(model_id: str, *, organization: Organization | None = None) -> ModelArchive:
    """Return the archive of the catalogue model ``model_id`` (``owner/name``), building it first
    when its directory changed since the last one. Raises LabError 404 ``not_found`` for an id
    that ``organization`` may not use (``installed_models``: with none, the models offered to
    everyone) and for a catalogue model with no directory in ``LAB_MODEL_DIR`` (the test model ``lab/tiny-random-llama`` is built, not stored; the SmolLM2 built-in is stored
    once a job has converted it)."""
    if model_id not in installed_models(organization):
        raise not_found("model")
    root = Path(settings.LAB_MODEL_DIR).resolve()
    model_dir = root / model_id
    if not (model_dir / "config.json").is_file():
        raise LabError(
            "not_found",
            f"Lab's model cache holds no directory for {model_id}: it is built when a job needs it "
            "(lab/tiny-random-llama), or not converted yet (SmolLM2 is, by its first job).",
        )
    members = _members(model_dir, root)
    folder = Path(settings.LAB_DATA_DIR) / "cache" / "model-archives" / model_id
    path = folder / f"{_fingerprint(members)}.tar"
    checksum = path.with_suffix(".sha256")
    if not (path.is_file() and checksum.is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".partial-"))
        try:
            (scratch / "sha256").write_text(_write_tar(scratch / "tar", members))
            os.replace(scratch / "sha256", checksum)  # the same bytes whoever wins a race
            os.replace(scratch / "tar", path)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for stale in folder.iterdir():  # the archives of the directory's earlier states
            if stale.is_file() and stale.suffix in (".tar", ".sha256") and stale.stem != path.stem:
                stale.unlink(missing_ok=True)
    return ModelArchive(path=path, size_bytes=path.stat().st_size, sha256=checksum.read_text().strip())
