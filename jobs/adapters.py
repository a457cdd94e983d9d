"""Adapter artifacts, in one place (docs/checkpoints.md, "Adapter artifacts").

An adapter is what ``[adapters]`` asks the engine to export every ``interval`` steps (0: only at
the end): the trained weights alone (a PEFT LoRA adapter, ``adapter_config.json`` +
``adapter_model.safetensors``, or for a full fine-tune the Hugging Face weights), without
optimizer or trainer state, as one uncompressed tar. The lifecycle follows checkpoints'
(``jobs.checkpoints``): the engine registers an adapter and gets an upload target, uploads the
tar, completes; Lab seals and re-hashes what is stored and marks it ``ready`` when size and
SHA-256 match (a JobEvent ``adapter.ready``, and its webhook), else ``failed`` (so is a ready one
whose stored archive Lab finds changed when it serves it). ``keep_last``
(-1 or absent: all) keeps the newest ready ones; the others become ``deleted``.

An adapter is unique per (job, step): the export of a step by a newer attempt (after a resume)
replaces an older attempt's, so a job's adapters are those of the run that produced its curve.
Objects live under the job's storage prefix (``<job id>/adapters/``), so deleting a job deletes
them with its checkpoints.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpResponse
from django.utils import timezone

from jobs import storage
from jobs.checkpoints import archive_download_response, refuse_other_attempt
from jobs.models import Adapter, AdapterStatus, EventLevel, EventType, Job, JobAttempt
from jobs.services import job_record_event
from lab.errors import LabError

logger = logging.getLogger(__name__)

#: The largest adapter archive Lab takes, in bytes (1 TiB: full bf16 weights of a 400B model fit).
MAX_ADAPTER_BYTES = 2**40


def adapter_key(*, job_public_id: str, adapter_public_id: str, attempt: int) -> str:
    """Return the storage key of an adapter archive written by ``attempt``.

    The attempt is part of the key, so a newer attempt's upload of a step never overwrites the
    object an older attempt's (ready) row still names until the replacement is registered.
    """
    return f"{job_public_id}/adapters/{adapter_public_id}-a{attempt}.tar"


def adapter_download_url(adapter_public_id: str) -> str:
    """Return the public API URL that downloads an adapter (``GET /api/v1/adapters/{id}/download``)."""
    return f"{settings.LAB_PUBLIC_URL}/api/v1/adapters/{adapter_public_id}/download"


def adapter_register(*, job: Job, attempt: JobAttempt, step: int, format: str) -> tuple[Adapter, dict[str, Any]]:
    """Create (or reuse) ``job``'s ``uploading`` adapter of ``step``; return it with its upload target.

    The caller holds the job row lock and has checked the attempt and the step. Registering the
    same step of the same attempt again returns the row already there with a fresh target (a
    retried registration, or Lab delivering an exited engine's spool). A step an older attempt
    exported is taken over: the row moves to this attempt, back to ``uploading``, and the old
    object is deleted after commit. The upload target is ``{"method": "local", "path": ...}`` or
    ``{"method": "put", "url": ..., "headers": {...}}`` (``jobs.storage.upload_target``).
    """
    adapter = Adapter.objects.filter(job=job, step=step).select_for_update().first()
    if adapter is None:
        adapter = Adapter(job=job, step=step, attempt=attempt.number, format=format, status=AdapterStatus.UPLOADING)
        adapter.storage_key = adapter_key(
            job_public_id=job.public_id, adapter_public_id=adapter.public_id, attempt=attempt.number
        )
        adapter.save(force_insert=True)
    elif adapter.attempt < attempt.number:
        storage.delete_after_commit(adapter.storage_key)
        storage.delete_after_commit(storage.upload_key(adapter.storage_key))
        adapter.attempt, adapter.format, adapter.status = attempt.number, format, AdapterStatus.UPLOADING
        adapter.size_bytes, adapter.sha256, adapter.ready_at = None, "", None
        adapter.created_at = timezone.now()
        adapter.storage_key = adapter_key(
            job_public_id=job.public_id, adapter_public_id=adapter.public_id, attempt=attempt.number
        )
        adapter.save()
    return adapter, storage.upload_target(storage.upload_key(adapter.storage_key))


def adapter_complete(*, job: Job, attempt_number: int, adapter_id: str, size_bytes: int, sha256: str) -> Adapter:
    """Verify the stored archive's size (bytes) and hex SHA-256: ``ready`` when they match, else ``failed``.

    The upload is sealed and hashed before any row is locked (as ``checkpoint_complete`` does);
    the outcome is applied under the job's lock. A ready adapter records an ``adapter.ready``
    JobEvent (data ``{"adapter_id", "step"}``; the webhook adds ``job_id`` and ``download_url``)
    and applies retention. Completing a ready adapter again is a no-op. Raises LabError ``not_found`` for
    an adapter of another job, 409 ``stale_attempt`` when ``attempt_number`` (the reporting
    attempt) is not the one the adapter now belongs to (a newer attempt took its step over) or the
    job has moved on to a newer attempt (``jobs.checkpoints.refuse_other_attempt``), 409
    ``invalid_state`` for one that failed or was deleted.
    """
    adapter = _completable(job=job, attempt_number=attempt_number, adapter_id=adapter_id)
    if adapter.status == AdapterStatus.READY:
        storage.discard_upload(adapter.storage_key)
        return adapter
    stored = storage.seal(adapter.storage_key, expected_size=size_bytes)
    with transaction.atomic():
        job = Job.objects.unscoped().select_for_update().get(pk=job.pk)
        adapter = _completable(job=job, attempt_number=attempt_number, adapter_id=adapter_id, lock=True)
        if adapter.status == AdapterStatus.READY:
            storage.discard_upload(adapter.storage_key)
            return adapter
        if stored == (size_bytes, sha256):
            adapter.status = AdapterStatus.READY
            adapter.size_bytes, adapter.sha256 = stored
            adapter.ready_at = timezone.now()
            adapter.save(update_fields=["status", "size_bytes", "sha256", "ready_at"])
            job_record_event(
                job=job,
                type=EventType.ADAPTER_READY,
                message=f"Adapter of step {adapter.step} is ready.",
                data={"adapter_id": adapter.public_id, "step": adapter.step},
            )
            adapter_apply_retention(job=job)
        else:
            found = "nothing" if stored is None else f"{stored[0]} bytes" + (f" with SHA-256 {stored[1][:12]}…" if stored[1] else "")
            _mark_failed(job=job, adapter=adapter, message=f"Adapter of step {adapter.step} failed verification: found {found}.")
        return adapter


def _completable(*, job: Job, attempt_number: int, adapter_id: str, lock: bool = False) -> Adapter:
    """Return ``job``'s adapter ``adapter_id``; 404 when it has none, 409 when another attempt owns
    it now or it failed or is deleted."""
    rows = Adapter.objects.select_for_update() if lock else Adapter.objects.all()
    adapter = rows.filter(job=job, public_id=adapter_id).first() if len(adapter_id) <= 64 else None
    if adapter is None:
        raise LabError("not_found", "No such adapter.")
    refuse_other_attempt(job=job, owner=adapter.attempt, attempt_number=attempt_number, what="adapter")
    if adapter.status in (AdapterStatus.FAILED, AdapterStatus.DELETED):
        raise LabError("invalid_state", f"This adapter is {adapter.status}; it cannot be completed.")
    return adapter


def _mark_failed(job: Job, adapter: Adapter, message: str) -> None:
    """Mark a locked adapter ``failed`` with a warning event; delete its objects after commit."""
    adapter.status = AdapterStatus.FAILED
    adapter.save(update_fields=["status"])
    job_record_event(
        job=job,
        type=EventType.ADAPTER_FAILED,
        level=EventLevel.WARNING,
        message=message,
        data={"adapter_id": adapter.public_id, "step": adapter.step},
    )
    storage.delete_after_commit(adapter.storage_key)
    storage.delete_after_commit(storage.upload_key(adapter.storage_key))


def adapter_apply_retention(*, job: Job) -> list[str]:
    """Keep the newest ``adapters.keep_last`` ready adapters of ``job`` (-1 or absent: all).

    The others become ``deleted`` (their rows stay listed, without a download) and their objects
    go after the caller's transaction commits. Returns the public ids deleted.
    """
    keep_last = (job.spec.get("adapters") or {}).get("keep_last")
    if keep_last is None or keep_last < 0:
        return []
    ready = list(Adapter.objects.filter(job=job, status=AdapterStatus.READY).order_by("-step"))
    removed = ready[keep_last:]
    for old in removed:
        old.status = AdapterStatus.DELETED
        storage.delete_after_commit(old.storage_key)
    if removed:
        Adapter.objects.bulk_update(removed, ["status"])
    return [old.public_id for old in removed]


def adapter_list(*, job: Job) -> QuerySet[Adapter]:
    """Return ``job``'s adapters, every status, for ``paginate_by_public_id`` (newest first)."""
    return Adapter.objects.filter(job=job).select_related("job")


def adapter_download_response(adapter: Adapter, *, request: Any) -> HttpResponse:
    """Return the HTTP answer that downloads ``adapter``'s tar (the caller checked access).

    The tar streamed (``Content-Disposition: attachment; filename="<job id>-step-<step>-<adapter
    id>.tar"``) once found unchanged since it became ready, or on S3 a 302 to a short-lived signed
    URL, each with the SHA-256 in ``X-Lab-Archive-SHA256``, as for checkpoints. Raises LabError
    409 ``adapter_not_ready`` for an adapter that is not ``ready``, 409 ``adapter_corrupted`` when
    its archive changed (the adapter is then failed), 404 when its object is gone.
    """
    if adapter.status != AdapterStatus.READY:
        raise LabError(
            "adapter_not_ready",
            f"Adapter {adapter.public_id} is {adapter.status}; only ready adapters can be downloaded.",
        )
    filename = f"{adapter.job.public_id}-step-{adapter.step:06d}-{adapter.public_id}.tar"
    return archive_download_response(adapter, filename=filename, request=request, fail=_mark_failed)


def adapter_fail_unfinished(*, job: Job, attempt_number: int) -> list[str]:
    """Fail the ``uploading`` adapters of an attempt that has ended (the caller holds the job's
    lock and has delivered the attempt's spool first): nothing will complete them any more.
    Returns the public ids failed."""
    failed = []
    for adapter in Adapter.objects.select_for_update().filter(job=job, attempt=attempt_number, status=AdapterStatus.UPLOADING):
        _mark_failed(
            job=job,
            adapter=adapter,
            message=f"Adapter of step {adapter.step} failed: attempt {attempt_number} ended before completing its upload.",
        )
        failed.append(adapter.public_id)
    return failed


def adapter_fail_abandoned(*, older_than: datetime) -> list[str]:
    """Fail ``uploading`` adapters registered before ``older_than`` whose attempt is over (the job
    moved on to a newer attempt, or finished): nothing will complete them. Returns the ids failed."""
    failed = []
    stale = Adapter.objects.unscoped().filter(status=AdapterStatus.UPLOADING, created_at__lte=older_than)
    for adapter_pk, job_pk in stale.values_list("pk", "job_id"):
        with transaction.atomic():
            job = Job.objects.unscoped().select_for_update().get(pk=job_pk)
            adapter = Adapter.objects.unscoped().select_for_update().filter(pk=adapter_pk, status=AdapterStatus.UPLOADING).first()
            if adapter is None or (adapter.attempt == job.attempt and not job.is_terminal):
                continue
            _mark_failed(
                job=job,
                adapter=adapter,
                message=f"Adapter of step {adapter.step} failed: attempt {adapter.attempt} ended before completing its upload.",
            )
            failed.append(adapter.public_id)
    return failed


def adapter_known_keys(keys: list[str]) -> set[str]:
    """Return those of ``keys`` (storage keys) that an adapter still needs: the archive of one that
    is not deleted or failed, and the upload of one still ``uploading`` (the orphan sweep spares them)."""
    known = set(
        Adapter.objects.unscoped()
        .filter(storage_key__in=keys, status__in=[AdapterStatus.UPLOADING, AdapterStatus.READY])
        .values_list("storage_key", flat=True)
    )
    uploads = {storage.archive_key_of_upload(key): key for key in keys if storage.archive_key_of_upload(key)}
    known |= {
        uploads[archive]
        for archive in Adapter.objects.unscoped()
        .filter(storage_key__in=list(uploads), status=AdapterStatus.UPLOADING)
        .values_list("storage_key", flat=True)
    }
    return known

