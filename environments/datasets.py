"""Datasets an organization pushes (``lab datasets push owner/name DIR|FILE``), which
``datasets.load_dataset("owner/name")`` resolves to in its builds and jobs, offline.

How a name resolves without a hub: ``datasets.load_dataset(path)`` loads a local folder when
``path`` is one, relative to the working directory, before it looks at the Hub (its documented
"local directory" case; with ``HF_DATASETS_OFFLINE=1`` the Hub is never asked, and the Hub's
own cache is not read for datasets). So builds and jobs run ``load_environment`` in a working
directory holding ``<owner>/<name>/`` with each snapshot's files (``engine.dataset_snapshots``),
and ``load_dataset("owner/name", split="train")`` reads them as it would read a Hub dataset
repository's files: its split names from the file names (``train.jsonl``, ``data/test-*.parquet``;
a lone file is ``train``), its format from their extension.

A push is one data file (``.jsonl``, ``.json``, ``.csv``, ``.tsv``, ``.parquet``, ``.txt``) or an
archive of a folder (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``; the CLI packs a folder as a tar)
holding at least one. Each data file is read through at push (JSON parsed, text decoded, Parquet's
magic checked), so a file ``load_dataset`` could not read is refused then, naming it. Lab stores
one uncompressed tar of the files in its storage, ``environments/datasets/<organization public
id>/<owner>/<name>/<sha256>.tar`` (under the environments' prefix, which the orphan sweep leaves).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from django.db import transaction
from django.utils import timezone

from environments.models import DatasetSnapshot
from environments.storage import KEY_PREFIX
from lab import storage
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import LabError, invalid, not_found
from lab.lib.locks import ENVIRONMENT_PUSH, advisory_xact_lock
from lab.models import Organization

logger = logging.getLogger(__name__)

#: The largest push, in bytes (the upload route's body limit, ``LAB_UPLOAD_PATH_PATTERN``, is the wheels').
MAX_DATASET_BYTES = 100 * 1024 * 1024
#: The most an archive may unpack to, in bytes, and the most files it may hold.
MAX_UNPACKED_BYTES = 512 * 1024 * 1024  # read in memory at push, to check every data file
MAX_FILES = 10_000
#: The data files ``load_dataset`` reads from a folder (its packaged builders' extensions).
DATA_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".txt")
ARCHIVE_EXTENSIONS = (".tar", ".tar.gz", ".tgz", ".zip")
TAR_CONTENT_TYPE = "application/x-tar"
_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_CHUNK = 1024 * 1024


def parse_dataset_id(dataset_id: str) -> tuple[str, str] | None:
    """Split ``<owner>/<name>`` as the Hugging Face Hub names datasets (each part letters, digits,
    ``-``, ``_`` and ``.``, starting and ending with a letter or digit, at most 96 characters, no
    ``--`` or ``..``); None when it is not of that form."""
    owner, slash, name = dataset_id.partition("/") if isinstance(dataset_id, str) else ("", "", "")
    if not slash:
        return None
    for part in (owner, name):
        if not _PART.match(part) or "--" in part or ".." in part:
            return None
    return owner, name


def _data_file_problem(path: str, data: bytes) -> str | None:
    """Why ``load_dataset`` could not read the data file ``path`` (its bytes ``data``), or None."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix == ".parquet":
        return None if len(data) >= 8 and data[:4] == b"PAR1" and data[-4:] == b"PAR1" else "it is not a Parquet file"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        return f"it is not UTF-8 text (byte {error.start})"
    if not text.strip():
        return "it is empty"
    if suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as error:
                    return f"line {number} is not JSON ({error})"
                if not isinstance(row, dict):
                    return f"line {number} is not a JSON object (one row per line)"
    elif suffix == ".json":
        try:
            json.loads(text)
        except ValueError as error:
            return f"it is not JSON ({error})"
    elif suffix in (".csv", ".tsv"):
        try:
            header = next(csv.reader(io.StringIO(text), delimiter="\t" if suffix == ".tsv" else ","))
        except csv.Error as error:
            return f"it is not {suffix[1:].upper()} ({error})"
        if not any(cell.strip() for cell in header):
            return "its first line names no column"
    return None


def _is_data_file(path: str) -> bool:
    return PurePosixPath(path).suffix.lower() in DATA_EXTENSIONS


def _member_path(name: str) -> str | None:
    """The relative POSIX path an archive member is stored under, or None for one that would land
    outside the snapshot's folder (absolute, ``..``) or is hidden (``.git/``, ``.DS_Store``: left out)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or any(part in ("..", "") for part in path.parts):
        raise invalid(
            f"The archive's member '{name[:200]}' is outside its folder (an absolute path or '..').", param="file"
        )
    if any(part.startswith(".") for part in path.parts):
        return None
    return path.as_posix()


def _archive_files(handle: BinaryIO, filename: str) -> list[tuple[str, bytes]]:
    """The regular files of the archive ``handle`` as ``(relative path, bytes)``; raises the 400
    for a broken archive, a link or device in it, or one that unpacks past the limits."""
    files: list[tuple[str, bytes]] = []
    total = 0

    def add(name: str, size: int, read) -> None:
        nonlocal total
        path = _member_path(name)
        if path is None:
            return
        total += size
        if len(files) >= MAX_FILES or total > MAX_UNPACKED_BYTES:
            raise invalid(
                f"The archive unpacks to more than {MAX_FILES} files or {MAX_UNPACKED_BYTES // 2**20} MB.", param="file"
            )
        files.append((path, read()))

    handle.seek(0)
    try:
        if filename.lower().endswith(".zip"):
            with zipfile.ZipFile(handle) as archive:
                for info in archive.infolist():
                    if not info.is_dir():
                        add(info.filename, info.file_size, lambda info=info: archive.read(info))
        else:
            with tarfile.open(fileobj=handle, mode="r:*") as archive:
                for member in archive:
                    if member.isdir():
                        continue
                    if not member.isfile():
                        raise invalid(
                            f"The archive's member '{member.name[:200]}' is a link or a device; push regular files only.",
                            param="file",
                        )
                    add(member.name, member.size, lambda member=member: archive.extractfile(member).read())
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
        raise invalid(
            f"'{filename}' is not a readable {'zip' if filename.lower().endswith('.zip') else 'tar'} archive: {error}.",
            param="file",
        ) from None
    return files


def read_upload(handle: BinaryIO, filename: str) -> list[tuple[str, bytes]]:
    """The files of a pushed dataset, ``[(relative path, bytes)]`` sorted by path: the one data
    file ``filename``, or an archive's files. Raises LabError ``invalid_request`` (param ``file``)
    for an unsupported file, an archive without data files, and any data file ``load_dataset``
    could not read, naming it."""
    lowered = filename.lower()
    if "/" in filename or "\\" in filename or not filename:
        raise invalid("Send the dataset with a plain file name.", param="file")
    if lowered.endswith(ARCHIVE_EXTENSIONS):
        files = _archive_files(handle, filename)
    elif _is_data_file(lowered):
        handle.seek(0)
        files = [(filename, handle.read())]
    else:
        raise invalid(
            f"'{filename}' is neither a data file ({', '.join(DATA_EXTENSIONS)}) nor an archive of a dataset's folder "
            f"({', '.join(ARCHIVE_EXTENSIONS)}).",
            param="file",
        )
    data_files = [(path, data) for path, data in files if _is_data_file(path)]
    if not data_files:
        raise invalid(
            f"'{filename}' holds no data file load_dataset reads ({', '.join(DATA_EXTENSIONS)}); "
            "push the folder of the dataset's files (train.jsonl, data/test-00000.parquet, ...).",
            param="file",
        )
    for path, data in data_files:
        problem = _data_file_problem(path, data)
        if problem is not None:
            raise invalid(f"The data file '{path[:200]}' cannot be read: {problem}.", param="file")
    return sorted(files)


def _write_tar(files: list[tuple[str, bytes]], target: Path) -> str:
    """Write ``files`` into the uncompressed tar ``target`` (fixed times and owners, so the same
    files make the same bytes); return its SHA-256."""
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as archive:
        for path, data in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256()
    with target.open("rb") as reader:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _dataset_key(organization: Organization, owner: str, name: str, sha256: str) -> str:
    return f"{KEY_PREFIX}datasets/{organization.public_id}/{owner}/{name}/{sha256}.tar"


def dataset_push(
    *, organization: Organization, actor: Actor, dataset_id: str, handle: BinaryIO, filename: str, size_bytes: int
) -> tuple[DatasetSnapshot, bool]:
    """Store the dataset in ``handle`` (seekable, ``size_bytes`` long, named ``filename``) as
    ``organization``'s snapshot of ``dataset_id`` (``<owner>/<name>``), replacing the one it had.

    Returns ``(snapshot, created)``: ``created`` is False when the name had a snapshot already
    (its files are replaced; the very same files leave it as it was). Raises LabError
    ``request_too_large`` above ``MAX_DATASET_BYTES``, and ``invalid_request`` for a name that is
    no Hugging Face dataset name (param ``name``) or files ``read_upload`` refuses (param
    ``file``); nothing is stored then. The replaced object goes once the new row commits.
    """
    parsed = parse_dataset_id(dataset_id)
    if parsed is None:
        raise invalid(
            f"'{str(dataset_id)[:200]}' is not a dataset name: name it as load_dataset does, <owner>/<name> "
            "(letters, digits, '-', '_' and '.'), e.g. acme/arith.",
            param="name",
        )
    if size_bytes > MAX_DATASET_BYTES:
        raise LabError(
            "request_too_large", f"Datasets are limited to {MAX_DATASET_BYTES // (1024 * 1024)} MB.", param="file"
        )
    owner, name = parsed
    files = read_upload(handle, filename)
    with tempfile.TemporaryDirectory(prefix="lab-dataset-") as scratch:
        tar = Path(scratch) / "snapshot.tar"
        sha256 = _write_tar(files, tar)
        key = _dataset_key(organization, owner, name, sha256)
        storage.put_file(key, tar, content_type=TAR_CONTENT_TYPE)
        stored_bytes = tar.stat().st_size
    listing = [{"path": path, "size_bytes": len(data)} for path, data in files]
    with transaction.atomic():
        # Pushes of one organization take turns (as its environment pushes do), so two first
        # pushes of one name cannot both create it.
        advisory_xact_lock(ENVIRONMENT_PUSH, organization.pk)
        snapshot = DatasetSnapshot.objects.for_organization(organization).filter(owner=owner, name=name).first()
        created = snapshot is None
        replaced_key = None if created or snapshot.storage_key == key else snapshot.storage_key
        if created:
            snapshot = DatasetSnapshot(organization=organization, owner=owner, name=name)
        snapshot.filename, snapshot.files, snapshot.sha256, snapshot.size_bytes = (
            filename,
            listing,
            sha256,
            stored_bytes,
        )
        snapshot.storage_key, snapshot.pushed_by, snapshot.pushed_by_key = key, actor.user, actor.api_key
        snapshot.updated_at = timezone.now()
        snapshot.save()
        audit_record(
            actor=actor,
            organization=organization,
            action=AuditAction.DATASET_PUSH,
            target=snapshot.public_id,
            data={"sha256": sha256, "size_bytes": stored_bytes, "files": len(files)},
        )
        if replaced_key is not None:
            transaction.on_commit(lambda: storage.delete(replaced_key))
    return snapshot, created


def dataset_list(*, organization: Organization) -> list[DatasetSnapshot]:
    """Return ``organization``'s snapshots by owner, then name."""
    return list(DatasetSnapshot.objects.for_organization(organization).order_by("owner", "name"))


def dataset_get(*, organization: Organization, dataset_id: str) -> DatasetSnapshot:
    """Return ``organization``'s snapshot of ``dataset_id``; raise the 404 ``not_found`` that a
    missing snapshot and another organization's share."""
    parsed = parse_dataset_id(dataset_id)
    found = (
        DatasetSnapshot.objects.for_organization(organization).filter(owner=parsed[0], name=parsed[1]).first()
        if parsed is not None
        else None
    )
    if found is None:
        raise not_found("dataset")
    return found


def dataset_delete(*, organization: Organization, actor: Actor, dataset_id: str) -> None:
    """Delete ``organization``'s snapshot of ``dataset_id`` (its object goes after commit); raise
    ``not_found`` as ``dataset_get`` does, changing nothing. Builds and jobs that start later no
    longer find the name."""
    with transaction.atomic():
        snapshot = dataset_get(organization=organization, dataset_id=dataset_id)
        key = snapshot.storage_key
        snapshot.delete()
        audit_record(
            actor=actor,
            organization=organization,
            action=AuditAction.DATASET_DELETE,
            target=f"{snapshot.owner}/{snapshot.name}",
        )
        transaction.on_commit(lambda: storage.delete(key))


def dataset_download_url(snapshot: DatasetSnapshot, *, expires_s: int = 3600) -> str:
    """Where an engine fetches the snapshot's tar: a ``file://`` URL on the filesystem backend,
    else a pre-signed GET URL good for ``expires_s`` seconds."""
    if storage.is_filesystem():
        return storage.path_of(snapshot.storage_key).as_uri()
    return storage.download_url(
        snapshot.storage_key, filename=f"{snapshot.name}.tar", content_type=TAR_CONTENT_TYPE, expires_s=expires_s
    )


def launch_datasets(organization_id: int) -> list[dict]:
    """The snapshots a job of the organization ``organization_id`` gets (``engine.dataset_snapshots``):
    ``[{"id": "<owner>/<name>", "sha256", "url"}]``, every one it has, by name."""
    snapshots = DatasetSnapshot.objects.unscoped().filter(organization_id=organization_id).order_by("owner", "name")
    return [
        {"id": snapshot.public_id, "sha256": snapshot.sha256, "url": dataset_download_url(snapshot)}
        for snapshot in snapshots
    ]


def copy_snapshots(organization_id: int, root: Path) -> list[dict]:
    """Unpack every snapshot of the organization ``organization_id`` into ``root/<owner>/<name>/``
    (the folder a build loads its environment in) and return ``[{"id", "sha256"}]`` of those
    unpacked. Runs in the worker: the tars are Lab's own (written by ``_write_tar``), unpacked
    with tarfile's ``data`` filter all the same."""
    unpacked = []
    for snapshot in (
        DatasetSnapshot.objects.unscoped().filter(organization_id=organization_id).order_by("owner", "name")
    ):
        target = root / snapshot.owner / snapshot.name
        target.mkdir(parents=True, exist_ok=True)
        try:
            with tempfile.TemporaryFile() as spool:
                with storage.open_object(snapshot.storage_key) as source:
                    shutil.copyfileobj(source, spool)
                spool.seek(0)
                with tarfile.open(fileobj=spool, mode="r:") as archive:
                    archive.extractall(target, filter="data")
        except (OSError, tarfile.TarError) as error:  # replaced or deleted meanwhile: the build goes on without it
            logger.warning(
                "dataset %s of organization %s not unpacked for a build: %s", snapshot.public_id, organization_id, error
            )
            shutil.rmtree(target, ignore_errors=True)
            continue
        unpacked.append({"id": snapshot.public_id, "sha256": snapshot.sha256})
    return unpacked
