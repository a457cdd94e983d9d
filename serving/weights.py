"""A deployed checkpoint's or adapter's weights, unpacked once on this machine for its server.

The archive is read from storage (the filesystem or S3, ``jobs.storage``) into a temporary file
while it is hashed; bytes that differ from the SHA-256 Lab verified when the artifact became
ready are never unpacked (the artifact is failed instead, ``verify_stored_archive``). The tar is
unpacked with ``tarfile``'s ``data`` filter (no links out, no devices), without
``trainer_state/``, into ``<weights dir>/<artifact id>/`` and renamed into place whole, so a
reader never sees half of it. What the directory must hold: a PEFT LoRA adapter
(``adapter_config.json`` and ``adapter_model.safetensors``) for ``peft-lora``, Hugging Face
weights (``config.json`` and ``*.safetensors``) for ``hf-full``; pickled weights are refused.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from pathlib import Path

from jobs import storage
from jobs.artifacts.downloads import verify_stored_archive
from jobs.models import Adapter, Checkpoint, CheckpointFormat
from lab.errors import LabError

_CHUNK = 1 << 20
#: What a checkpoint's archive holds that serving never needs.
_SKIPPED = ("trainer_state",)


def _layout_problem(directory: Path, format: str) -> str | None:
    """Return why ``directory`` cannot be served as ``format``, or None when it can."""
    if format == CheckpointFormat.PEFT_LORA:
        needed = ("adapter_config.json", "adapter_model.safetensors")
    else:
        needed = ("config.json",)
        if not any(directory.glob("*.safetensors")):
            return "it holds no .safetensors weights"
    missing = [name for name in needed if not (directory / name).is_file()]
    if missing:
        return f"it holds no {', '.join(missing)}"
    return None


def unpack_weights(artifact: Checkpoint | Adapter, weights_dir: Path) -> Path:
    """Return the directory holding ``artifact``'s weights under ``weights_dir``, unpacking its
    archive first unless that was done before.

    Raises LabError ``<kind>_corrupted`` when the stored archive no longer matches its SHA-256
    (the artifact is then failed), ``not_found`` when it is gone from storage, and
    ``invalid_request`` when it does not hold weights of its format.
    """
    target = weights_dir / artifact.public_id
    if target.is_dir():
        return target
    weights_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=weights_dir, prefix=f".{artifact.public_id}-") as scratch:
        archive = Path(scratch) / "archive.tar"
        digest = hashlib.sha256()
        try:
            with storage.open_archive(artifact.storage_key) as source, archive.open("wb") as copy:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    copy.write(chunk)
        except FileNotFoundError:
            raise LabError("not_found", f"The archive of {artifact.public_id} is no longer stored.") from None
        if digest.hexdigest() != artifact.sha256:
            verify_stored_archive(artifact)  # fails the artifact and raises; if it now matches, the read was torn
            raise LabError("internal_error", f"The archive of {artifact.public_id} changed while it was read; deploy it again.")
        unpacked = Path(scratch) / "weights"
        try:
            with tarfile.open(archive) as tar:
                members = [member for member in tar.getmembers() if member.name.split("/", 1)[0] not in _SKIPPED]
                tar.extractall(unpacked, members=members, filter="data")
        except (tarfile.TarError, OSError) as error:
            raise LabError("invalid_request", f"The archive of {artifact.public_id} cannot be unpacked: {error}") from None
        problem = _layout_problem(unpacked, artifact.format)
        if problem is not None:
            raise LabError("invalid_request", f"{artifact.public_id} cannot be served as {artifact.format}: {problem}.")
        try:
            unpacked.rename(target)
        except OSError:  # unpacked meanwhile by another pass: theirs is the same
            if not target.is_dir():
                raise
    return target


def remove_weights(weights_dir: Path, artifact_id: str) -> None:
    """Delete the unpacked weights of ``artifact_id`` (nothing when absent)."""
    if artifact_id and "/" not in artifact_id and artifact_id not in (".", ".."):
        shutil.rmtree(weights_dir / artifact_id, ignore_errors=True)
