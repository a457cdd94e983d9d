"""Services for jobs: submit, change status, cancel. Every status change goes through here.

``job_transition`` is the single place a job's status changes: it locks the row, refuses an
illegal transition with ``InvalidTransition`` (changing nothing), writes the JobEvent whose type is
the webhook event name (``jobs.events.job_record_event``), and updates the timestamps, all in one
transaction.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from billing.accounts import BLOCKER_MESSAGES, organization_run_blocker
from billing.pricing import list_cost_micro_usd, micro_to_usd
from jobs import dispatch, storage
from jobs.environment_packages import train_dataset_errors
from jobs.estimates import estimate_run_seconds
from jobs.events import job_record_event
from jobs.launchers.registry import get_launcher
from jobs.log_paths import path_hider
from jobs.models import (
    TERMINAL_STATUSES,
    AttemptState,
    Checkpoint,
    CheckpointStatus,
    ErrorCode,
    EventLevel,
    EventType,
    Job,
    JobAttempt,
    JobKind,
    JobPriority,
    JobStatus,
    LogLine,
    StatusReason,
    StopReason,
)
from jobs.secrets.services import masker, secrets_store, split_secrets
from jobs.specs import validate_job_spec
from jobs.stream import records as stream_records
from jobs.stream.fanout import publish_on_commit
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import FieldError, LabError
from lab.models import Project

logger = logging.getLogger(__name__)

S = JobStatus

#: Which status may follow which (docs/api.md "Statuses"). ``queued`` after ``starting`` or
#: ``running`` is a requeue (preemption, crash); after ``failed``/``cancelled`` a restart.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.QUEUED, S.CANCELLING, S.CANCELLED, S.FAILED, S.SUCCEEDED}),
    S.RUNNING: frozenset({S.QUEUED, S.CANCELLING, S.SUCCEEDED, S.FAILED}),
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset({S.QUEUED}),
    S.CANCELLED: frozenset({S.QUEUED}),
}

_EVENT_TYPES = {
    S.STARTING: EventType.STARTING,
    S.RUNNING: EventType.STARTED,
    S.CANCELLING: EventType.CANCELLING,
    S.SUCCEEDED: EventType.SUCCEEDED,
    S.FAILED: EventType.FAILED,
    S.CANCELLED: EventType.CANCELLED,
}


class InvalidTransition(Exception):
    """A status change the lifecycle does not allow; nothing was changed."""

    def __init__(self, job: Job, to: str):
        super().__init__(f"job {job.public_id} cannot go from {job.status} to {to}")
        self.job = job
        self.to = to


def _event_type(previous: str, to: str) -> str:
    if to == S.QUEUED:
        return EventType.RESTARTED if previous in (S.FAILED, S.CANCELLED) else EventType.REQUEUED
    return _EVENT_TYPES[to]


def require_billing_allows_runs(project: Project) -> None:
    """Raise LabError 402 with the billing code when nothing of ``project``'s organization can run
    (a failed payment, the monthly spend limit reached, credit used up: ``billing.accounts``)."""
    blocker = organization_run_blocker(project.organization_id)
    if blocker is not None:
        raise LabError(blocker, BLOCKER_MESSAGES[blocker])


@transaction.atomic
def job_submit(*, project: Project, actor: Actor, data: Any, kind: str = JobKind.TRAINING) -> Job:
    """Validate ``data`` as a job spec and create a queued job of ``kind`` (``JobKind``: an
    evaluation's job evaluates its ``[eval]`` section and never trains) in ``project``; a
    ``secrets`` member beside the spec's keys is stored encrypted for the job's engine
    (``jobs.secrets.services``).

    Returns the Job (``queued``, reason ``waiting``) with its ``job.queued`` event.
    Raises LabError ``invalid_spec`` listing every problem (``invalid_request`` for bad
    ``secrets``), and 402 (``insufficient_credit``,
    ``spend_limit_reached``, ``payment_failed``) when billing lets nothing of the organization run
    at all; nothing is created then.
    """
    data, secrets = split_secrets(data)
    validated = validate_job_spec(project=project, data=data, lock_environments=True, secret_names=secrets)
    spec = validated.parsed.spec
    evaluation_only = [key for key in ("adapter", "endpoint") if kind != JobKind.EVALUATION and getattr(spec.eval, key) is not None]
    if evaluation_only:  # Lab writes them into an evaluation's job spec (POST /evaluations); a training job has none
        message = "is set by Lab for an evaluation's job; evaluate an adapter or an endpoint with POST /evaluations"
        raise LabError(
            "invalid_spec", f"eval.{evaluation_only[0]}: {message}",
            errors=[FieldError(f"eval.{key}", "evaluation_only", message) for key in evaluation_only],
        )
    untrainable = [] if kind == JobKind.EVALUATION else train_dataset_errors(validated.environment_packages)
    if untrainable:
        raise LabError("invalid_spec", f"{untrainable[0].param}: {untrainable[0].message}", errors=untrainable)
    require_billing_allows_runs(project)
    now = timezone.now()
    job = Job.objects.create(
        project=project,
        created_by=actor.user,
        created_by_key=actor.api_key,
        name=spec.name or "",
        kind=kind,
        status=S.QUEUED,
        status_reason=StatusReason.WAITING,
        spec=validated.canonical,
        warnings=validated.warnings,
        metadata=dict(spec.metadata),
        priority=JobPriority[spec.priority.upper()],
        model=spec.model,
        gpu_type=spec.resources.gpu_type,
        gpus=spec.resources.gpus or 0,
        max_steps=spec.max_steps,
        init_from=validated.init_from,
        estimated_cost_usd=micro_to_usd(
            list_cost_micro_usd(
                gpu_type=spec.resources.gpu_type, gpus=spec.resources.gpus or 0, seconds=estimate_run_seconds(validated)
            )
        ),
        created_at=now,
        queued_at=now,
    )
    secrets_store(job=job, secrets=secrets)
    job_record_event(job=job, type=EventType.QUEUED, message="Job submitted and queued.", status_change=True)
    audit_record(
        actor=actor,
        organization=project.organization,
        project=project,
        action=AuditAction.JOB_CREATE,
        target=job.public_id,
    )
    dispatch.enqueue_admission()
    return job


def job_transition(
    *,
    job: Job,
    to: str,
    reason: str = "",
    error_code: str = "",
    error_message: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    current: bool = False,
) -> Job:
    """Move ``job`` to status ``to`` and record the matching JobEvent.

    ``reason`` becomes ``status_reason`` (queued jobs); ``error_code``/``error_message`` are set
    when failing. Returns the updated job (the row is locked and re-read first). With
    ``current``, the caller holds the job's row lock in this transaction and ``job`` is the row
    as it is now (every column the caller changed since it locked it set on it too): ``job``
    itself is changed and returned, not read again.
    Raises InvalidTransition, changing nothing, when the lifecycle forbids the move.
    """
    # No savepoint of its own: the change joins the caller's transaction (a reconciler pass
    # makes many), and a refusal, which wrote nothing, is raised once the block is left, so the
    # caller's transaction can go on.
    with transaction.atomic(savepoint=False):
        locked = job if current else Job.objects.unscoped().select_for_update().get(pk=job.pk)
        if to in ALLOWED_TRANSITIONS[locked.status]:
            _transition_locked(
                locked, to=to, reason=reason, error_code=error_code, error_message=error_message, message=message,
                data=data,
            )
            return locked
    raise InvalidTransition(locked, to)


def _transition_locked(
    locked: Job, *, to: str, reason: str, error_code: str, error_message: str, message: str, data: dict[str, Any] | None
) -> None:
    """Make ``job_transition``'s change of the locked ``locked``, which the lifecycle allows."""
    previous = locked.status
    now = timezone.now()
    locked.status = to
    locked.status_reason = reason if to == S.QUEUED else ""
    fields = ["status", "status_reason"]
    if to == S.QUEUED:
        locked.queued_at = now
        fields.append("queued_at")
        if previous in (S.FAILED, S.CANCELLED):
            locked.finished_at = None
            locked.error_code = locked.error_message = ""
            fields += ["finished_at", "error_code", "error_message"]
    if to == S.RUNNING and locked.started_at is None:
        locked.started_at = now
        fields.append("started_at")
    if to in (S.SUCCEEDED, S.FAILED, S.CANCELLED):
        locked.finished_at = now
        fields.append("finished_at")
    if to == S.FAILED:
        mask = masker(job_id=locked.public_id)  # an engine's error text may quote one of its secrets
        locked.error_code = error_code or ErrorCode.INTERNAL_ERROR
        locked.error_message, message = mask(error_message), mask(message)
        fields += ["error_code", "error_message"]
    locked.save(update_fields=fields)
    if locked.kind == JobKind.EVALUATION and to in TERMINAL_STATUSES:
        dispatch.enqueue_evaluation_settle(locked.pk)  # its results and webhook, from what it stored
    elif to == S.SUCCEEDED and (locked.spec.get("eval") or {}).get("evaluate_final_checkpoint"):
        dispatch.enqueue_final_checkpoint_evaluation(locked.pk)
    level = EventLevel.ERROR if to == S.FAILED else EventLevel.INFO
    event_data = {"from": previous, "to": to, **({"reason": reason} if reason else {}), **(data or {})}
    if to == S.FAILED:
        event_data["error"] = {"code": locked.error_code, "message": locked.error_message}
    job_record_event(
        job=locked, type=_event_type(previous, to), message=message, level=level, data=event_data, status_change=True
    )


#: Where an evaluation's job is restarted or deleted instead: as its evaluation.
_EVALUATION_ROUTES = {
    "restart": ("retry", "POST /api/v1/evaluations/{id}/retry", "lab evals retry {id}"),
    "delete": ("delete", "DELETE /api/v1/evaluations/{id}", "lab evals delete {id}"),
}


def require_kind(job: Job, kind: str, verb: str) -> None:
    """Refuse to ``verb`` (``restart`` or ``delete``) ``job`` unless it is of ``kind``
    (``JobKind``). The job of an evaluation is restarted and deleted only as its evaluation, which
    keeps its results and audit trail; the answer names the evaluation's own route (its id is the
    job's ``metadata.evaluation``). Raises LabError ``invalid_request`` (param ``job_id``)."""
    if job.kind == kind:
        return
    if job.kind == JobKind.EVALUATION:
        evaluation = job.metadata.get("evaluation") or "EVAL_ID"
        action, route, command = (text.format(id=evaluation) for text in _EVALUATION_ROUTES[verb])
        message = (
            f"{job.public_id} is the job of evaluation {evaluation}; {action} the evaluation instead: "
            f"{route} (`{command}`)."
        )
    else:
        message = f"{job.public_id} is a {job.kind} job; this operation is for {kind} jobs."
    raise LabError("invalid_request", message, param="job_id")


@transaction.atomic
def job_cancel(*, job: Job, actor: Actor) -> Job:
    """Cancel ``job``: a queued job is ``cancelled`` at once, a starting or running one ``cancelling``.

    Cancelling a job that is already cancelling is a no-op. Raises LabError ``invalid_state``
    for a finished job.
    """
    locked = Job.objects.unscoped().select_for_update().get(pk=job.pk)
    if locked.status == S.CANCELLING:
        return locked
    if locked.is_terminal:
        raise LabError("invalid_state", f"The job has already {locked.status}; there is nothing to cancel.")
    to = S.CANCELLED if locked.status == S.QUEUED else S.CANCELLING
    updated = job_transition(job=locked, to=to, message="Cancelled by request.")
    if to == S.CANCELLING:
        attempt_request_stop(job=updated, reason=StopReason.CANCEL)
        dispatch.enqueue_reconcile(updated.pk)
    audit_record(
        actor=actor,
        organization=job.project.organization,
        project=job.project,
        action=AuditAction.JOB_CANCEL,
        target=job.public_id,
    )
    return updated


def latest_ready_checkpoint(job: Job) -> Checkpoint | None:
    """Return ``job``'s ready checkpoint with the highest step (newest first on ties), or None."""
    return job.checkpoints.filter(status=CheckpointStatus.READY).order_by("-step", "-id").first()


@transaction.atomic
def job_claim_for_start(*, job_id: int, handle: dict | None = None) -> JobAttempt | None:
    """Claim a queued job for a new attempt: queued → starting with a conditional UPDATE.

    Returns the new JobAttempt (its launch task is enqueued on commit), or None when the job was
    no longer queued (another pass claimed it, or it was cancelled). With ``handle`` the attempt
    is already running there (a JobSet Kueue readmitted after a preemption, ``jobs.readmission``):
    it is created launched with that handle, and no launch is enqueued.
    """
    claimed = Job.objects.unscoped().filter(pk=job_id, status=S.QUEUED).update(
        status=S.STARTING, status_reason="", attempt=F("attempt") + 1
    )
    if claimed != 1:
        return None
    job = Job.objects.unscoped().get(pk=job_id)
    resume = latest_ready_checkpoint(job)
    attempt = JobAttempt.objects.create(
        job=job, number=job.attempt, launcher=settings.LAB_LAUNCHER, resume_from=resume,
        **({} if handle is None else {"state": AttemptState.LAUNCHED, "handle": handle, "launched_at": timezone.now()}),
    )
    if resume is not None and job.step != resume.step:
        job.step = resume.step
        job.save(update_fields=["step"])
    data = {"from": S.QUEUED, "to": S.STARTING, "attempt": attempt.number}
    if resume is not None:
        data["resume_from"] = {"checkpoint_id": resume.public_id, "step": resume.step}
    job_record_event(
        job=job, type=EventType.STARTING, message=f"Attempt {attempt.number} is starting.", data=data, status_change=True
    )
    if handle is None:
        dispatch.enqueue_launch(attempt.pk)
    return attempt


def current_attempt(job: Job) -> JobAttempt | None:
    """Return the job's latest attempt, or None before its first launch."""
    return job.attempts.filter(number=job.attempt).first() if job.attempt else None


@transaction.atomic
def attempt_request_stop(*, job: Job, reason: str) -> None:
    """Ask the job's current attempt to stop for ``reason`` (the status answer becomes ``stop``)."""
    JobAttempt.objects.filter(job=job, number=job.attempt, stop_reason="").update(
        stop_reason=reason, stop_requested_at=timezone.now()
    )


@transaction.atomic
def job_restart(*, job: Job, actor: Actor, kind: str = JobKind.TRAINING) -> Job:
    """Queue a failed or cancelled job of ``kind`` again; its next attempt resumes from its
    latest checkpoint (an evaluation's samples what it has not stored).

    Raises LabError ``invalid_request`` for a job of another kind (``require_kind``: an
    evaluation's job is retried as its evaluation), ``invalid_state`` for a job in any other
    status and for one that would fail the same way again (``Job.fails_again``: its message says
    to edit the spec and resubmit it, or to create a new evaluation), and 402 when billing lets
    nothing of its organization run (``require_billing_allows_runs``).
    """
    require_kind(job, kind, "restart")
    locked = Job.objects.unscoped().select_for_update().get(pk=job.pk)
    if locked.status not in (S.FAILED, S.CANCELLED):
        raise LabError("invalid_state", f"Only failed or cancelled jobs can restart; this one is {locked.status}.")
    if locked.fails_again:
        if locked.kind == JobKind.EVALUATION:
            raise LabError(
                "invalid_state",
                f"{locked.public_id} failed with {locked.error_code} before it sampled, so it would fail the same way "
                "again: create a new evaluation with what the error names changed.",
            )
        raise LabError(
            "invalid_state",
            f"{locked.public_id} failed with {locked.error_code} before it trained, so its spec would fail the same way "
            "again: edit the spec and submit it as a new job (\"Edit and resubmit\" on the job's page; "
            f"`lab jobs get {locked.public_id} --json` prints its spec).",
        )
    require_billing_allows_runs(job.project)
    Job.objects.unscoped().filter(pk=locked.pk).update(crash_count=0)
    updated = job_transition(job=locked, to=S.QUEUED, reason=StatusReason.WAITING, message="Restarted by request.")
    audit_record(
        actor=actor,
        organization=job.project.organization,
        project=job.project,
        action=AuditAction.JOB_RESTART,
        target=job.public_id,
    )
    dispatch.enqueue_admission()
    return updated


@transaction.atomic
def job_delete(*, job: Job, actor: Actor, kind: str = JobKind.TRAINING) -> None:
    """Delete a finished job of ``kind`` with its metrics, samples, logs, events, checkpoint
    objects and files.

    The files (checkpoint archives, and the launcher's work dirs of every attempt: spooled
    samples, logs, local weights) go once the rows are committed (``job_files_delete``).
    Raises LabError ``invalid_request`` for a job of another kind (``require_kind``: an
    evaluation's job goes with its evaluation) and ``invalid_state`` unless the job is terminal.
    """
    require_kind(job, kind, "delete")
    locked = Job.objects.unscoped().select_for_update().get(pk=job.pk)
    if not locked.is_terminal:
        raise LabError("invalid_state", f"Only finished jobs can be deleted; this one is {locked.status}. Cancel it first.")
    public_id = locked.public_id
    handles = [attempt.handle for attempt in locked.attempts.order_by("number")]
    audit_record(
        actor=actor,
        organization=job.project.organization,
        project=job.project,
        action=AuditAction.JOB_DELETE,
        target=public_id,
    )
    locked.delete()
    transaction.on_commit(lambda: job_files_delete(job_public_id=public_id, handles=handles))


def job_files_delete(*, job_public_id: str, handles: list[dict]) -> None:
    """Delete what a deleted job left outside the database: checkpoint objects and work dirs.

    ``handles`` are its attempts' launcher handles. Runs after the delete committed; a failure is
    logged, never raised (the job is gone either way, and the orphan sweep catches stray
    archives), and files already gone are fine.
    """
    try:
        storage.delete_job_objects(job_public_id)
    except Exception:
        logger.exception("deleting a job's checkpoint objects failed", extra={"job": job_public_id})
    try:
        get_launcher().delete_job_files(job_public_id, handles)
    except Exception:
        logger.exception("deleting a job's work dirs failed", extra={"job": job_public_id})


@transaction.atomic
def store_log_lines(*, job: Job, attempt_number: int, source: str, lines: list[tuple[int, datetime, str, str]]) -> int:
    """Store ``(source_seq, time, stream, line)`` tuples once each and stream the new ones;
    return how many were new (a resent line is skipped by the unique constraint)."""
    mask = masker(job_id=job.public_id)  # a job's secrets never reach its stored logs,
    hide = path_hider()  # nor this server's paths
    rows = [
        LogLine(job=job, attempt=attempt_number, source=source, source_seq=seq, time=time, stream=stream,
                line=hide(mask(line)))
        for seq, time, stream, line in lines
    ]
    if not rows:
        return 0
    stream_records.number(job.pk, rows)
    LogLine.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    stored = list(
        LogLine.objects.filter(
            job=job, stream_seq__gte=rows[0].stream_seq, stream_seq__lte=rows[-1].stream_seq
        ).order_by("stream_seq")
    )
    publish_on_commit(job.public_id, stream_records.log_records(stored))
    return len(stored)
