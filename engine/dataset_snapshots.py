"""The datasets an organization pushed (``lab datasets push owner/name``), unpacked where a
``load_environment`` environment's bridge runs, so that ``datasets.load_dataset("owner/name")``
reads them offline.

``datasets.load_dataset(path)`` loads a local folder when ``path`` is one, relative to the working
directory, before it would ask the Hub (which it never does offline, and its Hub cache is not read
for datasets): the bridge starts in ``<workdir>/environments/datasets``, holding
``<owner>/<name>/`` with each snapshot's files (``environments.datasets`` on Lab's side, which
hands them with a package's build as ``build.datasets``: ``[{"id": "owner/name", "sha256",
"url"}]``, each ``url`` a ``file://`` path into Lab's storage or a pre-signed URL to one tar).

The Hugging Face datasets the build fetched from the Hub while loading (``load_dataset("gsm8k")``)
come as ``build.hub_datasets``, ``{"sha256", "url"}``: one tar of ``huggingface_hub``'s and
``datasets``' caches (``environments.builder.hub_datasets``), which ``unpack_hub_datasets`` makes
the bridge's ``HF_HOME``; offline (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``), ``datasets``
loads the dataset from its cache and asks no hub.
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
#: Where a build's Hugging Face datasets are unpacked, under the attempt's work dir, by their SHA-256.
HUB_FOLDER = Path("environments") / "hf"


def _fetch_tar(url: str, sha256: str, spool: Path, read: Callable[[str], Iterator[bytes]]) -> bool:
    """Write the chunks ``read(url)`` gives to ``spool``; return whether their SHA-256 is ``sha256``."""
    digest = hashlib.sha256()
    with spool.open("wb") as writer:
        for chunk in read(url):
            digest.update(chunk)
            writer.write(chunk)
    return digest.hexdigest() == sha256


def unpack_hub_datasets(entry: dict | None, workdir: Path, read: Callable[[str], Iterator[bytes]], *, package_id: str) -> Path | None:
    """Fetch the build's Hugging Face datasets tar ``entry`` (``{"sha256", "url"}``) with ``read(url)``,
    check its SHA-256 and unpack it into ``<workdir>/environments/hf/<sha256>/`` (tarfile's ``data``
    filter: no links out of it, no absolute paths; found unpacked there, it is used as it is);
    return that folder, the bridge's ``HF_HOME``, or None without ``entry``. Raises
    InvalidEnvironment naming the package when it cannot be fetched, does not have its SHA-256 or is no tar."""
    if not entry:
        return None
    try:
        sha256, url = str(entry["sha256"]), entry["url"]
    except (KeyError, TypeError):
        raise InvalidEnvironment(f"package {package_id}: its build's Hugging Face datasets are not {{sha256, url}}") from None
    if not sha256.isalnum():
        raise InvalidEnvironment(f"package {package_id}: its build's Hugging Face datasets have no SHA-256")
    root = workdir / HUB_FOLDER
    target = root / sha256
    if (target / ".lab-unpacked").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    spool = root / f".{sha256}.tar"
    try:
        if not _fetch_tar(url, sha256, spool, read):
            raise InvalidEnvironment(f"package {package_id}: the fetched Hugging Face datasets' SHA-256 is not its build's")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        with tarfile.open(spool, mode="r:") as archive:
            archive.extractall(target, filter="data")
        (target / ".lab-unpacked").touch()
    except (OSError, tarfile.TarError) as error:
        raise InvalidEnvironment(f"package {package_id}: cannot fetch or unpack its build's Hugging Face datasets: {error}") from None
    finally:
        spool.unlink(missing_ok=True)
    return target


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
