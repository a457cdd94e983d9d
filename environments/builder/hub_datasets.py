"""The Hugging Face datasets a build's loading fetched, packed into one tar beside the build.

A build loads the environment with the Hub reachable (``HF_ENDPOINT``, Lab's ``LAB_HF_ENDPOINT``)
and the Hugging Face caches in its own scratch folder (``HF_HOME``): ``load_dataset("gsm8k")``
downloads the repository's files into ``huggingface_hub``'s cache (``<HF_HOME>/hub``) and
``datasets`` prepares its Arrow tables in its own (``<HF_HOME>/datasets``). ``pack`` puts both
caches into one uncompressed tar (lock files left out; symbolic links kept as links, never
followed: the hub cache's snapshots are relative links into its ``blobs``). A job unpacks it as
its bridge's ``HF_HOME`` and loads with ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``,
where ``datasets`` finds the dataset in its cache ("Using the latest cached version") and asks
no hub (``engine.dataset_snapshots.unpack_hub_datasets``).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import Any

from environments.builder.steps import BuildFailed, log

#: The caches under ``HF_HOME`` that are packed: ``huggingface_hub``'s files and ``datasets``' tables.
CACHES = ("hub", "datasets")
_CHUNK = 1024 * 1024


def _members(hf_home: Path) -> list[Path]:
    """Every file, link and folder of the packed caches under ``hf_home``, sorted; lock files left out."""
    members = []
    for cache in CACHES:
        root = hf_home / cache
        if not root.is_dir() or root.is_symlink():
            continue
        for folder, folders, files in os.walk(root):
            folders[:] = sorted(name for name in folders if name != ".locks")
            base = Path(folder)
            members.append(base)
            members += [base / name for name in sorted(files) if not name.endswith(".lock")]
            members += [base / name for name in folders if (base / name).is_symlink()]
    return members


def fetched_repositories(hf_home: Path) -> list[str]:
    """The Hub dataset repositories the hub cache holds, as ``owner/name`` (``datasets--owner--name``)."""
    root = hf_home / "hub"
    names = [path.name for path in root.glob("datasets--*")] if root.is_dir() else []
    return sorted(name.removeprefix("datasets--").replace("--", "/") for name in names)


def pack(hf_home: Path, target: Path, *, max_bytes: int) -> dict[str, Any] | None:
    """Pack the caches under ``hf_home`` into the tar ``target``; return the summary's
    ``hub_datasets``: ``{"sha256", "size_bytes" (the tar's), "files", "repositories"
    (["owner/name"])}``, or None when loading fetched nothing. Raises BuildFailed when the files
    come to more than ``max_bytes`` (``LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES``), naming both."""
    members = _members(hf_home)
    files = [path for path in members if path.is_file() and not path.is_symlink()]
    if not files:
        return None
    total = sum(path.lstat().st_size for path in files)
    repositories = fetched_repositories(hf_home)
    if total > max_bytes:
        raise BuildFailed(
            f"loading it fetched {total / 1e6:.1f} MB of Hugging Face datasets ({', '.join(repositories) or 'from the Hub'}), "
            f"more than builds keep ({max_bytes / 1e6:.1f} MB, LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES): load a smaller split "
            "or a slice (split=\"train[:1000]\"), or push the rows the environment needs with `lab datasets push`"
        )
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as archive:
        for path in members:
            archive.add(path, arcname=path.relative_to(hf_home).as_posix(), recursive=False)
    digest = hashlib.sha256()
    with target.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    size = target.stat().st_size
    log(f"Hugging Face datasets loading fetched: {', '.join(repositories) or 'none from the Hub'} "
        f"({len(files)} files, {total / 1e6:.2f} MB), kept as a {size / 1e6:.2f} MB snapshot")
    return {"sha256": digest.hexdigest(), "size_bytes": size, "files": len(files), "repositories": repositories}
