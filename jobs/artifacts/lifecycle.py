"""The artifact lifecycle, for every kind (``jobs.artifacts``; docs/checkpoints.md).

Every status change of a checkpoint or an adapter happens in a function of this module, so
whatever follows a change (its event and webhook, the live stream, retention) hooks here. Each
function takes the ``ArtifactKind`` it works on (``jobs.artifacts.kinds``) or finds it from the
row; nothing here asks which kind it has, it reads what the kind declares.

Only the attempt that registered an artifact completes it, while it is the job's current attempt
(``refuse_other_attempt``), and only while it is ``uploading`` or ``ready`` (completing a ready
one again is a no-op).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from jobs import storage
from jobs.artifacts.kinds import KINDS, ArtifactKind, kind_of
from jobs.artifacts.presenters import artifact_to_dict
from jobs.events import job_record_event
from jobs.models import TERMINAL_STATUSES, Artifact, CheckpointChange, EventLevel, Job, JobAttempt
from jobs.stream import records as stream_records
from jobs.stream.fanout import publish_on_commit
from lab.errors import LabError

logger = logging.getLogger(__name__)

#: The longest artifact id looked up; a longer one is as missing as an unknown one.
_MAX_ID_LENGTH = 64


def artifact_list(kind: ArtifactKind, *, job: Job) -> QuerySet[Artifact]:
    """Return ``job``'s artifacts of ``kind``, every status, with their job (for
    ``paginate_by_public_id``, newest first, or ordered by the caller)."""
    return kind.model.objects.filter(job=job).select_related("job")


def register(kind: ArtifactKind, *, job: Job, attempt: JobAttempt, step: int, format: str) -> tuple[Artifact, dict[str, Any]]:
    """Create (or reuse) ``job``'s ``uploading`` artifact of ``kind`` at ``step``; return it with its
    upload target.

    The caller holds the job row lock and has checked the attempt and the step (and that the job
    has not ended). Registering the same step of the same attempt again returns the row already
    there with a fresh target (a retried registration, or Lab delivering an exited engine's
    spool), so there are never two. A kind with one row per (job, step) (``per_attempt`` false)
    hands a step an older attempt exported over to this attempt: the row moves to it, back to
    ``uploading``, and the old objects are deleted after commit. The upload target is
    ``{"method": "local", "path": ...}`` or ``{"method": "put", "url": ..., "headers": {...}}``
    (``jobs.storage.upload_target``).
    """
    rows = kind.model.objects.select_for_update().filter(job=job, step=step)
    if kind.per_attempt:
        rows = rows.filter(attempt=attempt.number)
    artifact = rows.first()
    if artifact is None:
        artifact = kind.model(job=job, step=step, attempt=attempt.number, format=format, status=kind.statuses.UPLOADING)
        artifact.storage_key = kind.storage_key(
            job_public_id=job.public_id, public_id=artifact.public_id, attempt=attempt.number
        )
        artifact.save(force_insert=True)
        _save(kind, job, [artifact], [])
    elif artifact.attempt < attempt.number:
        storage.delete_after_commit(artifact.storage_key)
        storage.delete_after_commit(storage.upload_key(artifact.storage_key))
        artifact.attempt, artifact.format, artifact.status = attempt.number, format, kind.statuses.UPLOADING
        artifact.size_bytes, artifact.sha256, artifact.ready_at = None, "", None
        artifact.created_at = timezone.now()
        artifact.storage_key = kind.storage_key(
            job_public_id=job.public_id, public_id=artifact.public_id, attempt=attempt.number
        )
        fields = ["attempt", "format", "status", "size_bytes", "sha256", "ready_at", "created_at", "storage_key"]
        _save(kind, job, [artifact], fields)
    return artifact, storage.upload_target(storage.upload_key(artifact.storage_key))


def complete(
    kind: ArtifactKind, *, job: Job, attempt_number: int, artifact_id: str, size_bytes: int, sha256: str
) -> Artifact:
    """Verify the stored archive's size (bytes) and hex SHA-256: ``ready`` when they match, else ``failed``.

    The upload is sealed and hashed (on S3: downloaded) before any row is locked, so a large one
    does not hold up the job's other reports; the outcome is then applied under the job's lock
    unless a concurrent completion got there first. A ready artifact records a ``<kind>.ready``
    JobEvent (data ``{"<kind>_id", "step"}``) and applies retention; a failed one's objects are
    deleted. Completing a ready artifact again is a no-op. ``attempt_number`` is the reporting
    attempt. Raises LabError ``request_too_large`` for a size over the kind's ``max_bytes``
    (nothing changes), ``not_found`` for an artifact of another job, 409 ``stale_attempt`` when
    another attempt registered it (or took its step over) or the job has moved on to a newer
    attempt (``refuse_other_attempt``), and 409 ``invalid_state`` for one that failed or was deleted.
    """
    if kind.max_bytes is not None and size_bytes > kind.max_bytes:
        raise LabError(
            "request_too_large",
            f"{kind.title} archives may be at most {kind.max_bytes} bytes.",
            param="size_bytes",
        )
    artifact = _completable(kind, job=job, attempt_number=attempt_number, artifact_id=artifact_id)
    if artifact.status == kind.statuses.READY:
        storage.discard_upload(artifact.storage_key)
        return artifact
    stored = storage.seal(artifact.storage_key, expected_size=size_bytes)
    with transaction.atomic():
        job = Job.objects.unscoped().select_for_update().get(pk=job.pk)
        artifact = _completable(kind, job=job, attempt_number=attempt_number, artifact_id=artifact_id, lock=True)
        if artifact.status == kind.statuses.READY:
            storage.discard_upload(artifact.storage_key)
            return artifact
        _apply_verification(kind, job=job, artifact=artifact, stored=stored, expected=(size_bytes, sha256))
        return artifact


def _completable(kind: ArtifactKind, *, job: Job, attempt_number: int, artifact_id: str, lock: bool = False) -> Artifact:
    """Return ``job``'s artifact ``artifact_id`` of ``kind``; 404 when it has none, 409 when attempt
    ``attempt_number`` may not complete it or it failed or was deleted."""
    rows = kind.model.objects.select_for_update() if lock else kind.model.objects.all()
    artifact = rows.filter(job=job, public_id=artifact_id).first() if len(artifact_id) <= _MAX_ID_LENGTH else None
    if artifact is None:
        raise LabError("not_found", f"No such {kind.name}.")
    refuse_other_attempt(job=job, owner=artifact.attempt, attempt_number=attempt_number, what=kind.name)
    if artifact.status in (kind.statuses.FAILED, kind.statuses.DELETED):
        raise LabError("invalid_state", f"This {kind.name} is {artifact.status}; it cannot be completed.")
    return artifact


def refuse_other_attempt(*, job: Job, owner: int, attempt_number: int, what: str) -> None:
    """Refuse attempt ``attempt_number``'s completion of an upload (``what``: ``checkpoint``,
    ``adapter``) that attempt ``owner`` holds: only the attempt that registered it completes it,
    and only while that is the job's current attempt, so a superseded attempt's token settles
    nothing. Raises LabError ``stale_attempt`` (``param`` ``attempt``)."""
    if attempt_number < job.attempt:
        raise LabError(
            "stale_attempt",
            f"attempt {attempt_number} was superseded by attempt {job.attempt}.",
            param="attempt",
        )
    if owner != attempt_number:
        raise LabError("stale_attempt", f"This {what} belongs to attempt {owner}, not {attempt_number}.", param="attempt")


def _apply_verification(
    kind: ArtifactKind, *, job: Job, artifact: Artifact, stored: tuple[int, str] | None, expected: tuple[int, str]
) -> None:
    """Mark a locked ``uploading`` artifact ``ready`` or ``failed`` from what is stored: ``stored``
    and ``expected`` are (size in bytes, hex SHA-256); a stored hash is empty when the size
    already differed (nothing was hashed), and ``stored`` None when nothing was uploaded."""
    if stored == expected:
        artifact.status = kind.statuses.READY
        artifact.size_bytes, artifact.sha256 = stored
        artifact.ready_at = timezone.now()
        _save(kind, job, [artifact], ["status", "size_bytes", "sha256", "ready_at"])
        job_record_event(
            job=job,
            type=kind.ready_event,
            message=f"{kind.title} of step {artifact.step} is ready.",
            data={kind.id_field: artifact.public_id, "step": artifact.step},
        )
        apply_retention(kind, job=job)
        return
    if stored is None:
        found = "nothing"
    elif stored[1]:
        found = f"{stored[0]} bytes with SHA-256 {stored[1][:12]}…"
    else:
        found = f"{stored[0]} bytes, not the {expected[0]} reported"
    mark_failed(job, artifact, f"{kind.title} of step {artifact.step} failed verification: found {found}.")


def mark_failed(job: Job, artifact: Artifact, message: str) -> None:
    """Mark a locked artifact ``failed`` with a ``<kind>.failed`` warning event saying ``message``;
    delete its archive and upload after commit."""
    kind = kind_of(artifact)
    artifact.status = kind.statuses.FAILED
    _save(kind, job, [artifact], ["status"])
    job_record_event(
        job=job,
        type=kind.failed_event,
        level=EventLevel.WARNING,
        message=message,
        data={kind.id_field: artifact.public_id, "step": artifact.step},
    )
    storage.delete_after_commit(artifact.storage_key)
    storage.delete_after_commit(storage.upload_key(artifact.storage_key))


def apply_retention(kind: ArtifactKind, *, job: Job) -> list[str]:
    """Keep the newest ``keep_last`` ready artifacts of ``kind`` of ``job`` (the spec section the
    kind names; -1 or absent: all); the others become ``deleted``.

    The highest step is kept whenever ``keep_last`` keeps any, and so is one that a job still to
    run needs (the kind's ``needed_by``: a checkpoint another job starts from). A deleted row
    stays listed, without a download; its change is streamed like any other (a streamed kind),
    and its object goes after the caller's transaction commits. Returns the public ids deleted.
    """
    keep_last = (job.spec.get(kind.retention) or {}).get("keep_last")
    if keep_last is None or keep_last < 0:
        return []
    ready = list(kind.model.objects.filter(job=job, status=kind.statuses.READY).order_by("-step", "-id"))
    older = ready[keep_last:]
    still_needed: set[int] = set()
    if kind.needed_by and older:
        still_needed = set(
            Job.objects.unscoped()
            .filter(**{f"{kind.needed_by}__in": [row.pk for row in older]})
            .exclude(status__in=TERMINAL_STATUSES)
            .values_list(f"{kind.needed_by}_id", flat=True)
        )
    removed = [row for row in older if row.pk not in still_needed]
    for row in removed:
        row.status = kind.statuses.DELETED
        storage.delete_after_commit(row.storage_key)
    _save(kind, job, removed, ["status"])
    return [row.public_id for row in removed]


def _save(kind: ArtifactKind, job: Job, rows: list[Artifact], fields: list[str]) -> None:
    """Save ``fields`` of ``rows`` of ``job`` (none: nothing). For a streamed kind each row's new
    state is first numbered in the job's live stream, kept as a CheckpointChange (what a replay
    sends) and published after commit, and its ``stream_seq`` saved with the rest."""
    if not rows:
        return
    if kind.streamed:
        stream_records.number(job.pk, rows)
        changes = []
        for row in rows:
            row.job = job
            changes.append(CheckpointChange(job=job, checkpoint=row, stream_seq=row.stream_seq, snapshot=artifact_to_dict(row)))
        CheckpointChange.objects.bulk_create(changes)
        publish_on_commit(job.public_id, stream_records.checkpoint_records(changes))
        fields = [*fields, "stream_seq"]
    if not fields:
        return
    if len(rows) == 1:
        rows[0].save(update_fields=fields)
    else:
        kind.model.objects.bulk_update(rows, fields)


def fail_unfinished(kind: ArtifactKind, *, job: Job, attempt_number: int) -> list[str]:
    """Fail the ``uploading`` artifacts of ``kind`` of an attempt that has ended (the caller holds
    the job's lock and has delivered the attempt's spool first): nothing will complete them any
    more. A job's latest checkpoint stays the last ``ready`` one. Returns the public ids failed."""
    failed = []
    rows = kind.model.objects.select_for_update().filter(job=job, attempt=attempt_number, status=kind.statuses.UPLOADING)
    for artifact in rows:
        _fail_abandoned(job, artifact)
        failed.append(artifact.public_id)
    return failed


def _fail_abandoned(job: Job, artifact: Artifact) -> None:
    """Fail a locked ``uploading`` artifact whose attempt ended without completing it."""
    mark_failed(
        job,
        artifact,
        f"{kind_of(artifact).title} of step {artifact.step} failed: "
        f"attempt {artifact.attempt} ended before completing its upload.",
    )


def fail_abandoned(kind: ArtifactKind, *, older_than: datetime) -> list[str]:
    """Fail ``uploading`` artifacts of ``kind`` registered before ``older_than`` whose attempt is over.

    An attempt is over when the job has moved on to a newer attempt or has finished: nothing
    will complete its upload any more. The reconciler fails an ended attempt's uploads at once
    (``fail_unfinished``); this sweep catches what it could not (a crash in between).
    Returns the public ids failed.
    """
    failed = []
    uploading = kind.statuses.UPLOADING
    stale = kind.model.objects.unscoped().filter(status=uploading, created_at__lte=older_than)
    for artifact_pk, job_pk in stale.values_list("pk", "job_id"):
        with transaction.atomic():
            job = Job.objects.unscoped().select_for_update().get(pk=job_pk)
            artifact = kind.model.objects.unscoped().select_for_update().filter(pk=artifact_pk, status=uploading).first()
            if artifact is None or (artifact.attempt == job.attempt and not job.is_terminal):
                continue
            _fail_abandoned(job, artifact)
            failed.append(artifact.public_id)
    return failed


def known_keys(kind: ArtifactKind, keys: list[str]) -> set[str]:
    """Return those of ``keys`` (storage keys) that an artifact of ``kind`` still needs: the
    archive of one that is neither deleted nor failed, and the upload of one still ``uploading``."""
    rows = kind.model.objects.unscoped()
    known = set(
        rows.filter(storage_key__in=keys)
        .exclude(status__in=[kind.statuses.DELETED, kind.statuses.FAILED])
        .values_list("storage_key", flat=True)
    )
    uploads = {storage.archive_key_of_upload(key): key for key in keys if storage.archive_key_of_upload(key)}
    uploading = rows.filter(storage_key__in=list(uploads), status=kind.statuses.UPLOADING)
    return known | {uploads[archive] for archive in uploading.values_list("storage_key", flat=True)}


def sweep_orphans(*, now: datetime | None = None) -> int:
    """Delete stored objects that no artifact of any kind needs (``known_keys``); return how many went.

    Objects younger than ``LAB_ORPHAN_GRACE_S`` are left alone, so an upload that has not
    registered its row yet, or is still being written, is never removed. First, uploads that
    their attempt abandoned are failed (``fail_abandoned``). Idempotent: a second pass finds
    nothing more to delete.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.LAB_ORPHAN_GRACE_S)
    for kind in KINDS:
        fail_abandoned(kind, older_than=cutoff)
    candidates = [key for key, modified in storage.iter_objects() if modified <= cutoff]
    deleted = 0
    for batch_start in range(0, len(candidates), 500):
        batch = candidates[batch_start : batch_start + 500]
        known = set().union(*(known_keys(kind, batch) for kind in KINDS))
        for key in batch:
            if key not in known:
                storage.delete(key)
                deleted += 1
    if deleted:
        logger.info("deleted orphan checkpoint objects", extra={"count": deleted})
    return deleted
