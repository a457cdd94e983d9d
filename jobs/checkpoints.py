"""Checkpoints: the ``checkpoint`` kind of ``jobs.artifacts`` (docs/checkpoints.md), and what only
a checkpoint does.

A checkpoint is a saved training state of one attempt at one step. Its lifecycle (register,
upload, complete, ready or failed, retention, download) is ``jobs.artifacts.lifecycle``'s, with
what ``jobs.artifacts.kinds.CHECKPOINT`` declares. Only a checkpoint is started from: by an
engine, its job's own or its ``init_from`` (``checkpoint_for_engine``), and by a launcher
resuming a job's next attempt (``checkpoint_resume_archive``). An evaluation job's engine also
fetches the adapter it evaluates (``adapter_for_engine``).
"""

from __future__ import annotations

from pathlib import Path

from django.db.models import Q

from jobs import storage
from jobs.artifacts.downloads import verify_stored_archive
from jobs.models import Adapter, AdapterStatus, Checkpoint, CheckpointStatus, Job, JobKind
from lab.errors import LabError


def checkpoint_resume_archive(checkpoint: Checkpoint) -> Path:
    """Return the local path of ``checkpoint``'s archive (filesystem storage) for a launcher to
    resume from, once it is found unchanged since it became ready. Raises LabError
    ``checkpoint_corrupted`` when it changed (the checkpoint is then failed, so the job's next
    attempt resumes from the one before) and 404 when it is gone (``verify_stored_archive``)."""
    verify_stored_archive(checkpoint)
    return storage.path_of(checkpoint.storage_key)


def checkpoint_for_engine(*, job: Job, checkpoint_id: str) -> Checkpoint:
    """Return a ready checkpoint that ``job``'s engine may fetch: its own, or its ``init_from``.

    Raises LabError ``not_found`` for any other id (another job's checkpoint is as missing as an unknown one).
    """
    checkpoint = (
        Checkpoint.objects.unscoped()
        .select_related("job")
        .filter(public_id=checkpoint_id, status=CheckpointStatus.READY)
        .filter(Q(job=job) | Q(pk=job.init_from_id or 0))
        .first()
    )
    if checkpoint is None:
        raise LabError("not_found", f"No ready checkpoint '{checkpoint_id}' for this job.")
    return checkpoint


def adapter_for_engine(*, job: Job, adapter_id: str) -> Adapter:
    """Return the ready adapter an evaluation ``job``'s engine evaluates (its spec's ``[eval]
    adapter``, of the job's project).

    Raises LabError ``not_found`` for any other id, and for a job that evaluates no adapter.
    """
    wanted = (job.spec.get("eval") or {}).get("adapter") if job.kind == JobKind.EVALUATION else None
    adapter = (
        Adapter.objects.unscoped().select_related("job")
        .filter(public_id=adapter_id, status=AdapterStatus.READY, job__project_id=job.project_id)
        .first()
        if wanted == adapter_id else None
    )
    if adapter is None:
        raise LabError("not_found", f"No ready adapter '{adapter_id}' for this job.")
    return adapter
