"""The Hugging Face datasets a build fetched, kept beside it so that jobs on it load them offline.

A build loads its environment with the Hugging Face Hub reachable at ``LAB_HF_ENDPOINT`` and
the Hugging Face caches in its scratch folder; whatever loading fetched (``load_dataset("gsm8k")``:
``huggingface_hub``'s and ``datasets``' caches) the builder packs into one tar
(``environments.builder.hub_datasets``), which the worker stores content-addressed within the
build's organization, ``environments/hub-datasets/<organization>/<sha256>.tar`` (under the
environments' prefix, which the orphan sweep leaves; a build names only its own organization's
tars, so a build pod's result cannot hand a job another organization's datasets by their digest), and the build's summary describes as ``hub_datasets``: ``{"sha256", "size_bytes",
"files", "repositories": ["owner/name"]}`` (null when loading fetched nothing). A job on the build
gets it with the build (``jobs.environment_packages.launch_packages``: ``build.hub_datasets``,
``{"sha256", "url"}``), unpacks it as its bridge's Hugging Face cache and loads with
``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1`` (``engine.dataset_snapshots``): nothing is
fetched from a hub at run time.

``LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES`` (default 2 GiB) is the most one build's fetched
datasets may come to (a build past it fails naming it); 0 builds offline, fetching nothing.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from environments.storage import KEY_PREFIX
from lab import storage
from lab.config import env_int

PREFIX = f"{KEY_PREFIX}hub-datasets/"
#: The default of ``LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES``, in bytes.
DEFAULT_MAX_BYTES = 2 * 1024**3
CONTENT_TYPE = "application/x-tar"
#: The tar's name in a build's scratch folder.
FILENAME = "hub-datasets.tar"


def max_bytes() -> int:
    """The most the Hugging Face datasets one build fetches may come to, in bytes
    (``LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES``, Django's setting when set there); 0: none fetched."""
    value = getattr(settings, "LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES", None)
    return value if value is not None else env_int("LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES", DEFAULT_MAX_BYTES, minimum=0)


def builder_arguments(target: Path) -> list[str]:
    """The builder's arguments that have it load with the Hub at ``LAB_HF_ENDPOINT`` and pack what
    it fetched into ``target``; none (it loads offline) when ``max_bytes()`` is 0."""
    limit = max_bytes()
    if limit <= 0:
        return []
    return ["--hf-endpoint", settings.LAB_HF_ENDPOINT, "--hub-datasets", str(target), "--hub-datasets-max-bytes", str(limit)]


def key(organization_public_id: str, sha256: str) -> str:
    """The storage key of the organization's tar whose SHA-256 is ``sha256``."""
    return f"{PREFIX}{organization_public_id}/{sha256}.tar"


def store(organization_public_id: str, summary: dict, tar: Path) -> None:
    """Put the tar ``tar`` that a ready build's ``summary`` describes (``hub_datasets``) into the
    organization's storage, unless it holds those bytes already; nothing when loading fetched nothing."""
    fetched = summary.get("hub_datasets")
    if not fetched:
        return
    if not storage.object_storage().exists(key(organization_public_id, fetched["sha256"])):
        storage.put_file(key(organization_public_id, fetched["sha256"]), tar, content_type=CONTENT_TYPE)


def launch_entry(organization_public_id: str, summary: dict, *, expires_s: int = 3600) -> dict | None:
    """What a job on a build whose ``summary`` is this gets as ``build.hub_datasets``: ``{"sha256",
    "url"}``, ``url`` a ``file://`` URL on the filesystem backend, else a pre-signed GET URL good
    for ``expires_s`` seconds; None when its loading fetched nothing."""
    fetched = summary.get("hub_datasets")
    if not fetched:
        return None
    sha256 = fetched["sha256"]
    stored = key(organization_public_id, sha256)
    if not storage.object_storage().exists(stored) and storage.object_storage().exists(f"{PREFIX}{sha256}.tar"):
        stored = f"{PREFIX}{sha256}.tar"  # stored before tars were kept per organization, by this build
    if storage.is_filesystem():
        url = storage.path_of(stored).as_uri()
    else:
        url = storage.download_url(stored, filename=f"hub-datasets-{sha256[:12]}.tar", content_type=CONTENT_TYPE, expires_s=expires_s)
    return {"sha256": sha256, "url": url}
