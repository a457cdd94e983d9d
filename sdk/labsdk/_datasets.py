"""``client.datasets``: datasets the organization pushes under a Hugging Face name, which
``datasets.load_dataset("owner/name")`` resolves to in its environments' builds and jobs, offline
(docs/environments.md "Datasets")."""

from __future__ import annotations

import os
import tarfile
import tempfile
from datetime import datetime
from pathlib import Path

from pydantic import Field

from labsdk._common import paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.types import LabObject


class Dataset(LabObject):
    """A pushed dataset: ``id`` the name ``load_dataset`` is called with (``<owner>/<name>``),
    ``files`` the data files and others it holds (``[{"path", "size_bytes"}]``), ``filename``
    what was pushed, ``sha256`` and ``size_bytes`` of the tar Lab stores, ``updated_at`` its last push."""

    id: str
    owner: str | None = None
    name: str | None = None
    filename: str | None = None
    files: list[dict] = Field(default_factory=list)
    sha256: str | None = None
    size_bytes: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


def _dataset_path(dataset_id: str) -> str:
    """Return the URL path of the dataset ``<owner>/<name>``, each segment quoted."""
    owner, slash, name = dataset_id.partition("/") if isinstance(dataset_id, str) else ("", "", "")
    if not slash or not owner or not name or "/" in name:
        raise ValueError(f"expected a dataset name <owner>/<name>, got {dataset_id!r}")
    return f"datasets/{segment(owner)}/{segment(name)}"


def pack_dataset_directory(directory: str | Path, target: Path) -> Path:
    """Write the regular files under ``directory`` into the tar ``target`` and return it, with
    their paths relative to ``directory`` (``train.jsonl``, ``data/test-00000.parquet``): hidden
    files and folders (``.git``, ``.cache``) left out, links replaced by the files they point to
    (a Hugging Face cache's snapshot is links into its blobs). Raises ``ValueError`` for a
    folder without a file."""
    directory = Path(directory)
    count = 0
    with tarfile.open(target, "w", dereference=True) as tar:
        for folder, folders, files in os.walk(directory, followlinks=True):
            folders[:] = sorted(name for name in folders if not name.startswith("."))
            for name in sorted(files):
                path = Path(folder) / name
                if not name.startswith(".") and path.is_file():
                    tar.add(path, arcname=path.relative_to(directory).as_posix())
                    count += 1
    if not count:
        raise ValueError(f"{directory} holds no file to push")
    return target


class Datasets:
    """The organization's pushed datasets (``/datasets``)."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def push(self, name: str, path: str | Path) -> Dataset:
        """Push ``path`` as the organization's dataset ``name`` (``<owner>/<name>``, as
        ``load_dataset`` names it), replacing the one it had: a data file (``.jsonl``, ``.json``,
        ``.csv``, ``.tsv``, ``.parquet``, ``.txt``), an archive of a dataset's folder (``.tar``,
        ``.tar.gz``, ``.zip``), or a folder, packed as one tar here. At most 100 MB. Raises
        ``ValueError`` for a path that is neither a file nor a folder with files,
        ``BadRequestError`` for a name or files Lab refuses (its message names the file and why),
        ``RequestTooLargeError`` above the limit."""
        path = Path(path)
        if path.is_dir():
            with tempfile.TemporaryDirectory(prefix="lab-dataset-") as scratch:
                archive = pack_dataset_directory(path, Path(scratch) / f"{path.resolve().name or 'dataset'}.tar")
                return self._upload(name, archive, "application/x-tar")
        if not path.is_file():
            raise ValueError(f"{path} is neither a file nor a folder")
        return self._upload(name, path, "application/octet-stream")

    def _upload(self, name: str, file: Path, content_type: str) -> Dataset:
        return parse(
            Dataset,
            self._http.upload_stream(
                "datasets", fields={"name": name}, field="file", file=file, content_type=content_type
            ),
        )

    def list(self) -> list[Dataset]:
        """Return the organization's pushed datasets, by owner and name."""
        return list(paginate(self._http, "datasets", Dataset, {"limit": 100}))

    def retrieve(self, name: str) -> Dataset:
        """Return the dataset ``<owner>/<name>``. Raises ``NotFoundError`` for a missing one and
        another organization's alike."""
        return parse(Dataset, self._http.request("GET", _dataset_path(name)))

    get = retrieve

    def delete(self, name: str) -> None:
        """Delete the dataset ``<owner>/<name>``: builds and jobs that start later no longer find
        it. Raises ``NotFoundError`` as :meth:`retrieve` does."""
        self._http.request("DELETE", _dataset_path(name))
