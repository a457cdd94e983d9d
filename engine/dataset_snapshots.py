"""The datasets an organization pushed (``lab datasets push owner/name``), unpacked where a
``load_environment`` environment's bridge runs, so that ``datasets.load_dataset("owner/name")``
reads them offline.

``datasets.load_dataset(path)`` loads a local folder when ``path`` is one, relative to the working
directory, before it would ask the Hub (which it never does offline, and its Hub cache is not read
for datasets): the bridge starts in ``<workdir>/environments/datasets``, holding
``<owner>/<name>/`` with each snapshot's files (``environments.datasets`` on Lab's side, which
hands them with a package's build as ``build.datasets``: ``[{"id": "owner/name", "sha256",
"url"}]``, each ``url`` a ``file://`` path into Lab's storage or a pre-signed URL to one tar).
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.environments.base import InvalidEnvironment

#: Where the snapshots are unpacked, under the attempt's work dir: the bridge's working directory.
FOLDER = Path("environments") / "datasets"


def unpack_snapshots(snapshots: list[dict], workdir: Path, read: Callable[[str], Iterator[bytes]], *, package_id: str) -> Path:
    """Fetch each snapshot's tar with ``read(url)`` (its chunks), check its SHA-256 and unpack it
    into ``<workdir>/environments/datasets/<owner>/<name>/`` (afresh; tarfile's ``data`` filter:
    no links out, no absolute paths); return that folder, which exists even without snapshots.
    Raises InvalidEnvironment naming the package and the dataset when one cannot be fetched, does
    not have its SHA-256 or is no tar."""
    root = workdir / FOLDER
    root.mkdir(parents=True, exist_ok=True)
    for snapshot in snapshots:
        try:
            dataset_id, sha256, url = snapshot["id"], snapshot["sha256"], snapshot["url"]
            owner, name = dataset_id.split("/")
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InvalidEnvironment(f"package {package_id}: its build's datasets are not a list of snapshots") from None
        if owner in ("", ".", "..") or name in ("", ".", ".."):
            raise InvalidEnvironment(f"package {package_id}: the dataset name {dataset_id!r} is not <owner>/<name>")
        spool = root / f".{owner}--{name}.tar"
        digest = hashlib.sha256()
        try:
            with spool.open("wb") as writer:
                for chunk in read(url):
                    digest.update(chunk)
                    writer.write(chunk)
            if digest.hexdigest() != sha256:
                raise InvalidEnvironment(f"package {package_id}: the fetched dataset {dataset_id}'s SHA-256 is not the pushed one's")
            target = root / owner / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            with tarfile.open(spool, mode="r:") as archive:
                archive.extractall(target, filter="data")
        except (OSError, tarfile.TarError) as error:
            raise InvalidEnvironment(f"package {package_id}: cannot fetch or unpack the dataset {dataset_id}: {error}") from None
        finally:
            spool.unlink(missing_ok=True)
    return root
