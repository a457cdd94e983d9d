"""The artifact kinds and what tells them apart, as data: the lifecycle (``jobs.artifacts.lifecycle``)
reads an ``ArtifactKind`` and never asks which kind it has.

Imports only the models and storage keys, so anything may read a kind's declared data (the
webhook outbox builds an ``adapter.ready`` payload's download URL from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.db import models

from jobs import storage
from jobs.models import Adapter, AdapterStatus, Checkpoint, CheckpointStatus, EventType

#: The largest adapter archive Lab takes, in bytes (1 TiB: full bf16 weights of a 400B model fit).
MAX_ADAPTER_BYTES = 2**40


@dataclass(frozen=True)
class ArtifactKind:
    """What one kind of artifact declares.

    ``model`` is its table; its name (``checkpoint``) names its events (``<name>.ready``,
    ``<name>.failed``), error codes (``<name>_not_ready``, ``<name>_corrupted``), the id field of
    its event data (``<name>_id``), its routes (``/api/v1/<name>s/{id}/download``) and the spec
    section whose ``keep_last`` keeps the newest ready ones (``[<name>s]``; -1 or absent: all).
    ``statuses`` are its status choices. ``per_attempt``: a row per (job, attempt, step), so a
    resumed attempt's step is a new row; else one per (job, step), which a newer attempt's
    registration takes over (the old object goes). ``streamed``: its changes are records of the
    job's live stream (``CheckpointChange``). ``needed_by``: the Job field through which a job
    still to run needs one (kept whatever ``keep_last`` says). ``max_bytes``: the largest archive
    taken at completion (None: what the ingest body allows).
    """

    model: type[Checkpoint | Adapter]
    statuses: type[models.TextChoices]
    per_attempt: bool = False
    streamed: bool = False
    needed_by: str | None = None
    max_bytes: int | None = None

    @property
    def name(self) -> Literal["checkpoint", "adapter"]:
        """``checkpoint`` or ``adapter``."""
        return self.model._meta.model_name

    @property
    def title(self) -> str:
        """The kind's name as a sentence starts it (``Checkpoint``)."""
        return self.name.capitalize()

    @property
    def id_field(self) -> str:
        """The key of the artifact's public id in its events' data and webhooks (``checkpoint_id``)."""
        return f"{self.name}_id"

    @property
    def retention(self) -> str:
        """The spec section that holds its ``keep_last`` (``checkpoints``)."""
        return f"{self.name}s"

    @property
    def ready_event(self) -> EventType:
        """The event type of one becoming ready (``checkpoint.ready``), which a webhook sends."""
        return EventType(f"{self.name}.ready")

    @property
    def failed_event(self) -> EventType:
        """The event type (a warning) of one failing verification or being abandoned."""
        return EventType(f"{self.name}.failed")

    def storage_key(self, *, job_public_id: str, public_id: str, attempt: int) -> str:
        """Return where the archive of artifact ``public_id`` written by ``attempt`` is stored.

        A kind with one row per step names the attempt in the key, so a newer attempt's upload
        of a step never overwrites the object an older attempt's (ready) row still names until
        it is replaced.
        """
        if self.per_attempt:
            return storage.checkpoint_key(job_public_id, public_id)
        return f"{job_public_id}/{self.name}s/{public_id}-a{attempt}.tar"

    def download_url(self, public_id: str) -> str:
        """Return the public API URL that downloads artifact ``public_id``."""
        return f"{settings.LAB_PUBLIC_URL}/api/v1/{self.name}s/{public_id}/download"


#: A saved training state of one attempt at one step: what a job resumes from and another starts
#: from (``init_from``; ``jobs.checkpoints``). Its changes are numbered in the live stream.
CHECKPOINT = ArtifactKind(Checkpoint, CheckpointStatus, per_attempt=True, streamed=True, needed_by="init_from")
#: What ``[adapters]`` asks the engine to export every ``interval`` steps (0: only at the end): the
#: trained weights alone (a PEFT LoRA adapter, ``adapter_config.json`` + ``adapter_model.safetensors``,
#: or for a full fine-tune the Hugging Face weights), without optimizer or trainer state. One per
#: step, so a job's adapters are those of the run that produced its curve; stored under
#: ``<job id>/adapters/``, so deleting a job deletes them with its checkpoints.
ADAPTER = ArtifactKind(Adapter, AdapterStatus, max_bytes=MAX_ADAPTER_BYTES)

#: Every kind, in the order the orphan sweep visits them.
KINDS = (CHECKPOINT, ADAPTER)


def kind_of(row: Checkpoint | Adapter) -> ArtifactKind:
    """Return the kind of an artifact row."""
    return CHECKPOINT if isinstance(row, Checkpoint) else ADAPTER
