"""The checkpoint lifecycle, in one place (docs/checkpoints.md).

``pending → uploading → ready | failed``, then ``ready → deleted`` (retention): the engine
registers a checkpoint and gets an upload target, uploads one uncompressed tar, completes; Lab
re-hashes what is stored and marks it ``ready`` when size and SHA-256 match, else ``failed``. Every status change of a checkpoint
happens in a function of this module, so whatever follows a change (events, the live stream)
hooks here. Only the attempt that registered a checkpoint completes it, while it is the job's
current attempt. A ready checkpoint whose stored archive no longer has the SHA-256 it was
verified with, found when Lab serves it or resumes from it, becomes ``failed`` too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.db.models import Q
from django.http import FileResponse, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.utils import timezone
from django.utils.http import content_disposition_header

from jobs import storage
from jobs.models import (
    TERMINAL_STATUSES,
    Adapter,
    Checkpoint,
    CheckpointChange,
    CheckpointStatus,
    EventLevel,
    EventType,
    Job,
    JobAttempt,
)
from jobs.serializers import checkpoint_to_dict
from jobs.services import job_record_event
from jobs.stream import records as stream_records
from jobs.stream.fanout import publish_on_commit
from lab.errors import LabError

logger = logging.getLogger(__name__)

# A redirect's signed URL only has to outlive the client following it (seconds).
DOWNLOAD_URL_EXPIRE_S = 300
#: The header of a download answer (the archive, or the redirect to it) that gives the hex
#: SHA-256 the archive was verified with, so whoever fetches it can check what arrived.
ARCHIVE_SHA256_HEADER = "X-Lab-Archive-SHA256"


def checkpoint_register(*, job: Job, attempt: JobAttempt, step: int, format: str) -> tuple[Checkpoint, dict[str, Any]]:
    """Create an ``uploading`` checkpoint of ``job`` at ``step`` and return it with its upload target.

    The caller holds the job row lock and has checked the attempt and the step (and that the job
    has not ended). The upload target is
    ``{"method": "local", "path": ...}`` or ``{"method": "put", "url": ..., "headers": {...}}``.
    A checkpoint is unique per (job, attempt, step): registering the same step of the same
    attempt again returns the row already there (with a fresh target), so a retried
    registration, or Lab delivering an exited engine's spool, never makes two.
    """
    existing = Checkpoint.objects.filter(job=job, attempt=attempt.number, step=step).first()
    if existing is not None:
        return existing, storage.upload_target(storage.upload_key(existing.storage_key))
    checkpoint = Checkpoint.objects.create(
        job=job, step=step, attempt=attempt.number, format=format, status=CheckpointStatus.UPLOADING
    )
    checkpoint.storage_key = storage.checkpoint_key(job.public_id, checkpoint.public_id)
    _stream_changes(job, [checkpoint])
    checkpoint.save(update_fields=["storage_key", "stream_seq"])
    return checkpoint, storage.upload_target(storage.upload_key(checkpoint.storage_key))


def checkpoint_complete(*, job: Job, attempt_number: int, checkpoint_id: str, size_bytes: int, sha256: str) -> Checkpoint:
    """Verify the stored archive's size (bytes) and hex SHA-256: ``ready`` when they match, else ``failed``.

    The archive is read (on S3: downloaded) before any row is locked, so a large one does not
    hold up the job's other reports; the outcome is then applied under the job's lock unless a
    concurrent completion got there first. Completing an already ready checkpoint again is a
    no-op. A failed one's object is deleted. ``attempt_number`` is the reporting attempt. Raises
    LabError ``not_found`` for a checkpoint of another job, 409 ``stale_attempt`` when another attempt
    registered it or the job has moved on to a newer attempt (``refuse_other_attempt``), and 409
    ``invalid_state`` for one that already failed.
    """
    checkpoint = _completable(job=job, attempt_number=attempt_number, checkpoint_id=checkpoint_id)
    if checkpoint.status == CheckpointStatus.READY:
        storage.discard_upload(checkpoint.storage_key)
        return checkpoint
    stored = storage.seal(checkpoint.storage_key, expected_size=size_bytes)
    with transaction.atomic():
        job = Job.objects.unscoped().select_for_update().get(pk=job.pk)
        checkpoint = _completable(job=job, attempt_number=attempt_number, checkpoint_id=checkpoint_id, lock=True)
        if checkpoint.status == CheckpointStatus.READY:
            storage.discard_upload(checkpoint.storage_key)
            return checkpoint
        return _apply_verification(job=job, checkpoint=checkpoint, stored=stored, expected=(size_bytes, sha256))


def _completable(*, job: Job, attempt_number: int, checkpoint_id: str, lock: bool = False) -> Checkpoint:
    """Return ``job``'s checkpoint ``checkpoint_id``; 404 when it has none, 409 when attempt
    ``attempt_number`` may not complete it or it failed."""
    rows = Checkpoint.objects.select_for_update() if lock else Checkpoint.objects.all()
    checkpoint = rows.filter(job=job, public_id=checkpoint_id).first()
    if checkpoint is None:
        raise LabError("not_found", "No such checkpoint.")
    refuse_other_attempt(job=job, owner=checkpoint.attempt, attempt_number=attempt_number, what="checkpoint")
    if checkpoint.status == CheckpointStatus.FAILED:
        raise LabError("invalid_state", "This checkpoint already failed verification.")
    return checkpoint


def refuse_other_attempt(*, job: Job, owner: int, attempt_number: int, what: str) -> None:
    """Refuse attempt ``attempt_number``'s completion of an upload (``what``: a checkpoint, or an
    adapter of ``jobs.adapters``) that attempt ``owner`` holds: only the attempt that registered
    it completes it, and only while that is the job's current attempt, so a superseded attempt's
    token settles nothing. Raises LabError ``stale_attempt`` (``param`` ``attempt``)."""
    if attempt_number < job.attempt:
        raise LabError(
            "stale_attempt",
            f"attempt {attempt_number} was superseded by attempt {job.attempt}.",
            param="attempt",
        )
    if owner != attempt_number:
        raise LabError("stale_attempt", f"This {what} belongs to attempt {owner}, not {attempt_number}.", param="attempt")


def _apply_verification(
    *, job: Job, checkpoint: Checkpoint, stored: tuple[int, str] | None, expected: tuple[int, str]
) -> Checkpoint:
    """Mark a locked ``uploading`` checkpoint ``ready`` or ``failed`` from what is stored."""
    if stored == expected:
        checkpoint.status = CheckpointStatus.READY
        checkpoint.size_bytes, checkpoint.sha256 = stored
        checkpoint.ready_at = timezone.now()
        _stream_changes(job, [checkpoint])
        checkpoint.save(update_fields=["status", "size_bytes", "sha256", "ready_at", "stream_seq"])
        job_record_event(
            job=job,
            type=EventType.CHECKPOINT_READY,
            message=f"Checkpoint of step {checkpoint.step} is ready.",
            data={"checkpoint_id": checkpoint.public_id, "step": checkpoint.step},
        )
        checkpoint_apply_retention(job=job)
    else:
        if stored is None:
            found = "nothing"
        elif stored[1]:
            found = f"{stored[0]} bytes with SHA-256 {stored[1][:12]}…"
        else:
            found = f"{stored[0]} bytes, not the {expected[0]} reported"
        _mark_failed(job=job, checkpoint=checkpoint, message=f"Checkpoint of step {checkpoint.step} failed verification: found {found}.")
    return checkpoint


def _mark_failed(job: Job, checkpoint: Checkpoint, message: str) -> None:
    """Mark a locked checkpoint ``failed`` with a ``checkpoint.failed`` event; delete its object after commit."""
    checkpoint.status = CheckpointStatus.FAILED
    _stream_changes(job, [checkpoint])
    checkpoint.save(update_fields=["status", "stream_seq"])
    job_record_event(
        job=job,
        type=EventType.CHECKPOINT_FAILED,
        level=EventLevel.WARNING,
        message=message,
        data={"checkpoint_id": checkpoint.public_id, "step": checkpoint.step},
    )
    storage.delete_after_commit(checkpoint.storage_key)
    storage.delete_after_commit(storage.upload_key(checkpoint.storage_key))


def checkpoint_apply_retention(*, job: Job) -> list[str]:
    """Keep the newest ``checkpoints.keep_last`` ready checkpoints of ``job`` (-1: all); delete the rest.

    The final checkpoint (the highest step) is always kept, and so is one that a job still to
    run starts from (``init_from``). A deleted checkpoint's row stays, with status ``deleted``,
    and the change is a ``checkpoint`` record of the live stream like any other, so a replay
    is the history that was sent live; its object goes after the caller's transaction commits.
    Returns the public ids deleted.
    """
    keep_last = job.spec["checkpoints"]["keep_last"]
    if keep_last == -1:  # -1 keeps them all
        return []
    ready = list(Checkpoint.objects.filter(job=job, status=CheckpointStatus.READY).order_by("-step", "-id"))
    still_needed = set(
        Job.objects.unscoped().filter(init_from__in=[c.pk for c in ready[keep_last:]])
        .exclude(status__in=TERMINAL_STATUSES)
        .values_list("init_from_id", flat=True)
    )
    removed = [old for old in ready[keep_last:] if old.pk not in still_needed]
    for old in removed:
        old.status = CheckpointStatus.DELETED
        storage.delete_after_commit(old.storage_key)
    if removed:
        _stream_changes(job, removed)
        Checkpoint.objects.bulk_update(removed, ["status", "stream_seq"])
    return [old.public_id for old in removed]


def _stream_changes(job: Job, rows: list[Checkpoint]) -> None:
    """Number the new state of each of ``rows`` in the job's live stream, keep it as a
    CheckpointChange (what a replay sends) and publish it after commit. The caller saves the rows."""
    stream_records.number(job.pk, rows)
    changes = []
    for row in rows:
        row.job = job
        changes.append(CheckpointChange(job=job, checkpoint=row, stream_seq=row.stream_seq, snapshot=checkpoint_to_dict(row)))
    CheckpointChange.objects.bulk_create(changes)
    publish_on_commit(job.public_id, stream_records.checkpoint_records(changes))


def checkpoint_download_response(checkpoint: Checkpoint, *, request: Any) -> HttpResponse:
    """Return the HTTP answer to ``request`` that downloads ``checkpoint``'s archive (the caller
    checked access).

    On the filesystem: the tar itself, once it is found to still have the SHA-256 it was
    verified with (``verify_stored_archive``), streamed (``Content-Length``, ``Content-Disposition:
    attachment; filename="<job id>-step-<step>-<checkpoint id>.tar"``) a megabyte at a time, as an
    asynchronous iterator under ASGI (Django would read a synchronous one whole into memory
    first) and as a FileResponse under WSGI. On S3: 302 to a pre-signed GET URL good for
    ``DOWNLOAD_URL_EXPIRE_S`` seconds, unread: the receiver checks the bytes against the SHA-256
    in ``ARCHIVE_SHA256_HEADER``, which both answers carry. Raises LabError
    ``checkpoint_not_ready`` for a checkpoint that is not ``ready``, 409 ``checkpoint_corrupted``
    when its archive changed (the checkpoint is then failed), and 404 when its object has gone missing.
    """
    if checkpoint.status != CheckpointStatus.READY:
        raise LabError(
            "checkpoint_not_ready",
            f"Checkpoint {checkpoint.public_id} is {checkpoint.status}; only ready checkpoints can be downloaded.",
        )
    return archive_download_response(
        checkpoint, filename=checkpoint_archive_filename(checkpoint), request=request, fail=_mark_failed
    )


def archive_download_response(
    row: Checkpoint | Adapter, *, filename: str, request: Any, fail: Callable[[Job, Any, str], None]
) -> HttpResponse:
    """Return the HTTP answer that downloads the ready ``row``'s stored tar (a checkpoint's, or an
    adapter's: ``jobs.adapters``) as ``filename``; see ``checkpoint_download_response``.

    ``fail(job, row, message)`` marks the locked row failed when its archive changed
    (``verify_stored_archive``). Raises LabError ``not_found`` when the object has gone missing and 409
    ``<kind>_corrupted`` when it changed.
    """
    if storage.is_filesystem():
        verify_stored_archive(row, fail=fail)
        try:
            handle = storage.open_archive(row.storage_key)
        except FileNotFoundError:
            raise _archive_gone(row) from None
        if isinstance(getattr(request, "_request", request), ASGIRequest):
            response = StreamingHttpResponse(_read_in_thread(handle), content_type=storage.ARCHIVE_CONTENT_TYPE)
            response["Content-Disposition"] = content_disposition_header(True, filename)
        else:
            response = FileResponse(handle, as_attachment=True, filename=filename, content_type=storage.ARCHIVE_CONTENT_TYPE)
        response["Content-Length"] = str(row.size_bytes)
    else:
        response = HttpResponseRedirect(storage.download_url(row.storage_key, filename=filename, expires_s=DOWNLOAD_URL_EXPIRE_S))
        response["Cache-Control"] = "no-store"
    response[ARCHIVE_SHA256_HEADER] = row.sha256
    return response


def verify_stored_archive(row: Checkpoint | Adapter, *, fail: Callable[[Job, Any, str], None]) -> None:
    """Check that the ready ``row``'s stored archive still has the size and SHA-256 it was
    verified with when it became ready; read it whole (on S3: download it), holding no lock.

    A changed archive is never served or resumed from: ``fail(job, row, message)`` marks the row
    (locked, with its job, if still ready with that SHA-256) failed with a warning event, and
    LabError ``<kind>_corrupted`` (``checkpoint_corrupted``, ``adapter_corrupted``) is raised.
    Raises LabError ``not_found`` when the object has gone missing.
    """
    kind = type(row).__name__
    stored = storage.stored_size_and_sha256(row.storage_key, expected_size=row.size_bytes)
    if stored is None:
        raise _archive_gone(row)
    if stored == (row.size_bytes, row.sha256):
        return
    message = (
        f"{kind} of step {row.step} failed verification: its stored archive no longer matches the SHA-256 "
        f"recorded when it became ready ({row.sha256[:12]}…)."
    )
    with transaction.atomic():
        job = Job.objects.unscoped().select_for_update().get(pk=row.job_id)
        rows = type(row).objects.unscoped().select_for_update()
        locked = rows.filter(pk=row.pk, status=row.status, sha256=row.sha256).first()
        if locked is not None:
            fail(job, locked, message)
    raise LabError(
        f"{kind.lower()}_corrupted",
        f"{kind} {row.public_id} failed verification: its stored archive no longer matches the SHA-256 recorded "
        "when it became ready; it is now failed.",
    )


def _archive_gone(row: Checkpoint | Adapter) -> LabError:
    """Return the 404 for a ready row whose archive is no longer in storage."""
    return LabError("not_found", f"This {type(row).__name__.lower()}'s archive is no longer stored.")


def checkpoint_resume_archive(checkpoint: Checkpoint) -> Path:
    """Return the local path of ``checkpoint``'s archive (filesystem storage) for a launcher to
    resume from, once it is found unchanged since it became ready. Raises LabError
    ``checkpoint_corrupted`` when it changed (the checkpoint is then failed, so the job's next
    attempt resumes from the one before) and 404 when it is gone (``verify_stored_archive``)."""
    verify_stored_archive(checkpoint, fail=_mark_failed)
    return storage.path_of(checkpoint.storage_key)


async def _read_in_thread(handle, chunk_size: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """Yield ``handle``'s bytes, each read in a worker thread; close it however the reading ends."""
    read = sync_to_async(handle.read, thread_sensitive=False)
    try:
        while chunk := await read(chunk_size):
            yield chunk
    finally:
        await sync_to_async(handle.close, thread_sensitive=False)()


def checkpoint_archive_filename(checkpoint: Checkpoint) -> str:
    """Return the file name a downloaded archive is saved as."""
    return f"{checkpoint.job.public_id}-step-{checkpoint.step:06d}-{checkpoint.public_id}.tar"


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


def checkpoint_sweep_orphans(*, now: datetime | None = None) -> int:
    """Delete stored objects that no checkpoint or adapter row refers to; return how many went.

    Objects younger than ``LAB_ORPHAN_GRACE_S`` are left alone, so an upload that has not
    registered its row yet, or is still being written, is never removed. First, uploads that
    their attempt abandoned are failed (``checkpoint_fail_abandoned``, ``adapter_fail_abandoned``). Idempotent: a second pass
    finds nothing more to delete.
    """
    from jobs.adapters import adapter_fail_abandoned, adapter_known_keys  # adapters build on this module

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.LAB_ORPHAN_GRACE_S)
    checkpoint_fail_abandoned(older_than=cutoff)
    adapter_fail_abandoned(older_than=cutoff)
    candidates = [key for key, modified in storage.iter_objects() if modified <= cutoff]
    deleted = 0
    for batch_start in range(0, len(candidates), 500):
        batch = candidates[batch_start : batch_start + 500]
        known = set(
            Checkpoint.objects.unscoped()
            .filter(storage_key__in=batch)
            .exclude(status=CheckpointStatus.DELETED)
            .values_list("storage_key", flat=True)
        )
        # An upload belongs to its archive's row while that checkpoint is still uploading.
        uploads = {storage.archive_key_of_upload(key): key for key in batch if storage.archive_key_of_upload(key)}
        known |= {
            uploads[archive]
            for archive in Checkpoint.objects.unscoped().filter(
                storage_key__in=list(uploads), status=CheckpointStatus.UPLOADING
            ).values_list("storage_key", flat=True)
        }
        known |= adapter_known_keys(batch)
        for key in batch:
            if key not in known:
                storage.delete(key)
                deleted += 1
    if deleted:
        logger.info("deleted orphan checkpoint objects", extra={"count": deleted})
    return deleted


def checkpoint_fail_unfinished(*, job: Job, attempt_number: int) -> list[str]:
    """Fail the ``uploading`` checkpoints of an attempt that has ended (the caller holds the job's
    lock, and has delivered the attempt's spool first): nothing will complete them any more.
    ``latest_checkpoint`` stays the last ``ready`` one. Returns the public ids failed."""
    failed = []
    for checkpoint in Checkpoint.objects.select_for_update().filter(
        job=job, attempt=attempt_number, status=CheckpointStatus.UPLOADING
    ):
        _fail_abandoned(job, checkpoint)
        failed.append(checkpoint.public_id)
    return failed


def _fail_abandoned(job: Job, checkpoint: Checkpoint) -> None:
    """Fail a locked ``uploading`` checkpoint whose attempt ended without completing it."""
    _mark_failed(
        job=job,
        checkpoint=checkpoint,
        message=f"Checkpoint of step {checkpoint.step} failed: attempt {checkpoint.attempt} ended before completing its upload.",
    )


def checkpoint_fail_abandoned(*, older_than: datetime) -> list[str]:
    """Fail ``uploading`` checkpoints registered before ``older_than`` whose attempt is over.

    An attempt is over when the job has moved on to a newer attempt or has finished: nothing
    will complete its upload any more. The reconciler fails an ended attempt's uploads at once
    (``checkpoint_fail_unfinished``); this sweep catches what it could not (a crash in between).
    Returns the public ids failed.
    """
    failed = []
    stale = Checkpoint.objects.unscoped().filter(status=CheckpointStatus.UPLOADING, created_at__lte=older_than)
    for checkpoint_pk, job_pk in stale.values_list("pk", "job_id"):
        with transaction.atomic():
            job = Job.objects.unscoped().select_for_update().get(pk=job_pk)
            checkpoint = (
                Checkpoint.objects.unscoped()
                .select_for_update()
                .filter(pk=checkpoint_pk, status=CheckpointStatus.UPLOADING)
                .first()
            )
            if checkpoint is None or (checkpoint.attempt == job.attempt and not job.is_terminal):
                continue
            _fail_abandoned(job, checkpoint)
            failed.append(checkpoint.public_id)
    return failed

