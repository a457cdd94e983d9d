"""Downloading a model from the Hugging Face endpoint Lab is configured with, for an operator's
``manage.py models add`` (never at a job's run time).

``huggingface_hub`` speaks the Hub's API: the model's revision (``GET /api/models/<id>/revision/
<revision>``: its commit and file list) and each file (``/<id>/resolve/<commit>/<path>``). The
endpoint is ``HF_ENDPOINT`` (``settings.LAB_HF_ENDPOINT``), the token ``HF_TOKEN`` (or
``HF_TOKEN_FILE``); no token of the machine's own Hugging Face login is used. Only the files a
model needs are fetched (``engine.model_check.DOWNLOAD_PATTERNS``): never a pickle, nor code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
from django.conf import settings
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from engine.model_check import DOWNLOAD_PATTERNS, PICKLE_SUFFIXES, is_kept
from lab.errors import LabError


@dataclass(frozen=True)
class HubSnapshot:
    """A model downloaded from the endpoint: its directory, the commit it was at (the revision
    Lab stores it under) and the repository's files that were not fetched."""

    directory: Path
    commit: str
    left_out: list[str]


@contextlib.contextmanager
def _online() -> Iterator[None]:
    """Let ``huggingface_hub`` reach the endpoint in this process. The engine's modules set
    ``HF_HUB_OFFLINE`` for every process that imports them (engine.config.hub_offline), and the
    library reads it once at import, so a process that imported the engine first would refuse
    the operator's download."""
    offline = hub_constants.HF_HUB_OFFLINE
    hub_constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = offline


def _refusal(hub_id: str, revision: str | None, error: Exception) -> LabError:
    where = f"{hub_id}" + (f" at revision {revision}" if revision else "")
    if isinstance(error, GatedRepoError):
        message = f"{where} is gated: accept its licence on the Hub and set HF_TOKEN to a token that may read it"
    elif isinstance(error, RepositoryNotFoundError):
        message = f"{settings.LAB_HF_ENDPOINT} has no model {hub_id} (or it is private and HF_TOKEN may not read it)"
    elif isinstance(error, RevisionNotFoundError):
        message = f"{hub_id} has no revision {revision!r}"
    else:
        message = f"cannot download {where} from {settings.LAB_HF_ENDPOINT}: {error}"
    return LabError("invalid_model", message)


def hub_download(*, hub_id: str, revision: str | None, target: Path) -> HubSnapshot:
    """Download the files of model ``hub_id`` at ``revision`` (default the main branch) that Lab
    stores into ``target``. Raises LabError ``invalid_model`` when the endpoint has no such model
    or revision, refuses the token, cannot be reached, or the model has no safetensors weights
    (naming the pickles it has instead)."""
    api = huggingface_hub.HfApi(endpoint=settings.LAB_HF_ENDPOINT, token=settings.LAB_HF_TOKEN or False)
    with _online():
        try:
            info = api.model_info(hub_id, revision=revision)
        except (HfHubHTTPError, OSError, ValueError) as error:
            raise _refusal(hub_id, revision, error) from None
        names = sorted(sibling.rfilename for sibling in info.siblings or [])
        if not any(name.endswith(".safetensors") for name in names):
            pickles = [name for name in names if name.lower().endswith(PICKLE_SUFFIXES)]
            raise LabError(
                "invalid_model",
                f"{hub_id} at {info.sha} has no safetensors weights"
                + (f" (only {', '.join(pickles[:5])}: pickles, which Lab never loads)" if pickles else "")
                + "; Lab loads safetensors only",
            )
        try:
            huggingface_hub.snapshot_download(
                hub_id, revision=info.sha, endpoint=settings.LAB_HF_ENDPOINT, token=settings.LAB_HF_TOKEN or False,
                local_dir=target, allow_patterns=list(DOWNLOAD_PATTERNS), max_workers=4,
            )
        except (HfHubHTTPError, OSError, ValueError) as error:
            raise _refusal(hub_id, info.sha, error) from None
    return HubSnapshot(directory=target, commit=info.sha, left_out=[name for name in names if not is_kept(name)])
