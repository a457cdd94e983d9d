"""Applying what was seen of one active job under its row lock: launch retries, captured output,
usage, the waiting reason, the heartbeat and runtime limits, stop signals, and an ended
attempt's outcome (``jobs.pipeline.outcomes.decide``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from billing.accounts import spend_limit_stop_message
from jobs import dispatch
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT
from jobs.artifacts.lifecycle import fail_unfinished
from jobs.evaluation_samples import missing_evaluation_samples
from jobs.events import job_record_event
from jobs.ingest.spool import deliver_attempt_spool
from jobs.launchers.base import AttemptPhase, Launcher, Observation
from jobs.models import (
    ACTIVE_STATUSES,
    AttemptState,
    CheckpointStatus,
    ErrorCode,
    EventLevel,
    EventType,
    Job,
    JobAttempt,
    JobKind,
    JobStatus,
    LogSource,
    MetricStep,
    StopReason,
)
from jobs.pipeline.kueue import park, show_waiting_reason
from jobs.pipeline.observe import Seen
from jobs.pipeline.outcomes import decide, incomplete_evaluation
from jobs.pipeline.usage import raise_usage_totals, record_usage
from jobs.services import attempt_request_stop, current_attempt, job_transition, store_log_lines
from sandboxes.services import sandbox_end_for_attempt

logger = logging.getLogger(__name__)
S = JobStatus

#: A pending attempt whose launch task has not run after this long gets its launch re-enqueued.
RELAUNCH_AFTER = timedelta(seconds=30)


@dataclass
class EndedFacts:
    """What finishing a batch of ended attempts reads, read once for all of them under their
    jobs' locks (``read_ended_facts``)."""

    #: ``(job pk, attempt number)`` of the current attempts with a checkpoint still ``uploading``.
    uploading_checkpoints: set[tuple[int, int]]
    #: the same, for adapters.
    uploading_adapters: set[tuple[int, int]]
    #: job pk -> how many of the steps 1..max_steps have their metrics stored.
    stored_steps: dict[int, int]
    #: job pk -> the status of its final checkpoint (step max_steps, of its latest attempt); none
    #: registered: left out.
    final_status: dict[int, str]
    #: the attempts whose due usage the batch closed in the ledger already.
    usage_closed: set[int]
    #: the attempts the batch ended already (``end_attempts``).
    attempts_ended: set[int] = field(default_factory=set)


def lock_active(job_id: int) -> tuple[Job | None, JobAttempt | None]:
    """Lock ``job_id`` if it is active and return it (with its project) and its current attempt:
    one query when it has one (the attempt row with its job, locking the job's row only)."""
    attempt = (
        JobAttempt.objects.select_for_update(of=("job",)).select_related("job__project")
        .filter(job_id=job_id, number=F("job__attempt"), job__status__in=ACTIVE_STATUSES).first()
    )
    if attempt is not None:
        return attempt.job, attempt
    job = (
        Job.objects.unscoped().select_for_update(of=("self",)).select_related("project")
        .filter(pk=job_id, status__in=ACTIVE_STATUSES).first()
    )
    return job, (current_attempt(job) if job is not None else None)


def apply_seen(job_id: int, seen: Seen | None, launcher, after: list[Callable[[], None]]) -> None:
    """Apply what was seen of ``job_id``'s attempt under the job's lock."""
    job, attempt = lock_active(job_id)
    if job is None:
        return
    apply_locked(job, attempt, seen, launcher, after, timezone.now())


def apply_locked(
    job: Job, attempt: JobAttempt | None, seen: Seen | None, launcher, after: list[Callable[[], None]], now,
    facts: EndedFacts | None = None,
) -> None:
    """Apply what was seen of an active ``job``'s current ``attempt`` (the caller holds the job's
    lock); ``facts`` as ``finish_attempt`` takes them, and an ended attempt whose usage they
    show closed already is not closed again."""
    if attempt is None or attempt.state == AttemptState.ENDED:
        job_transition(job=job, to=S.FAILED, error_code=ErrorCode.INTERNAL_ERROR, error_message="The job lost its attempt.")
        return
    if attempt.state == AttemptState.PENDING:
        if job.status == S.CANCELLING:
            attempt.state, attempt.ended_at = AttemptState.ENDED, now
            attempt.save(update_fields=["state", "ended_at"])
            job_transition(job=job, to=S.CANCELLED, message="Cancelled before it started.")
            dispatch.enqueue_admission()
        elif now - attempt.created_at > RELAUNCH_AFTER:
            dispatch.enqueue_launch(attempt.pk)
        return
    if seen is None or seen.attempt_id != attempt.pk:
        return  # launched after the launcher was asked: the next pass looks at it
    store_captured(job, attempt, seen)
    observation = seen.observation
    if observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST):
        if facts is None or attempt.pk not in facts.usage_closed:
            record_usage(job, attempt, observation, now)
        finish_attempt(job, attempt, observation, now, launcher, after, facts)
        return
    record_usage(job, attempt, observation, now)
    if observation.phase == AttemptPhase.PENDING and job.status == S.STARTING:
        show_waiting_reason(job, observation)
    # A cluster attempt may wait in Kueue long after its launch: its clock starts with its pods.
    last_sign_of_life = attempt.last_heartbeat_at or max(attempt.launched_at, observation.started_at or attempt.launched_at)
    if observation.phase == AttemptPhase.RUNNING and now - last_sign_of_life > timedelta(
        seconds=settings.LAB_HEARTBEAT_TIMEOUT_S
    ):
        logger.warning("heartbeat lost; killing the attempt", extra={"job": job.public_id, "attempt": attempt.number})
        handle = attempt.handle
        after.append(lambda: launcher.cancel(handle, force=True))
        return
    runtime_limit = timedelta(minutes=job.spec["max_runtime_minutes"])
    if job.started_at and now - job.started_at > runtime_limit and not attempt.stop_reason:
        attempt_request_stop(job=job, reason=StopReason.RUNTIME)
        attempt.refresh_from_db()
    signal_if_due(attempt, launcher, now, after)


def store_captured(job: Job, attempt: JobAttempt, seen: Seen) -> None:
    """Store the launcher's captured output lines and the handle's read progress."""
    if seen.lines:
        now = timezone.now()
        store_log_lines(
            job=job,
            attempt_number=attempt.number,
            source=LogSource.LAUNCHER,
            lines=[(line.seq, now, line.stream, line.line) for line in seen.lines],
        )
    if seen.handle_changed:  # only the launcher's own progress: what else the handle got meanwhile stays
        JobAttempt.objects.filter(pk=attempt.pk).update(handle=seen.handle)


def finish_attempt(
    job: Job, attempt: JobAttempt, observation: Observation, now, launcher: Launcher, after: list[Callable[[], None]],
    facts: EndedFacts | None = None,
) -> None:
    """Apply the exit-code table (``jobs.pipeline.outcomes.decide``) to an attempt that ended
    (the caller holds the job's lock); the launcher's cleanup is queued on ``after``, to run once
    the lock is released. ``facts`` (read for a whole batch under the same lock,
    ``jobs.pipeline.batch.read_ended_facts``) spare the reads of uploads and of a succeeded job's
    data where they show there is nothing to do, and the write of an attempt the batch ended
    already (``jobs.pipeline.batch.end_attempts``). The sandboxes the attempt's engine made are
    deleted once the lock is released, so none outlives the attempt however it ended."""
    attempt.state, attempt.ended_at, attempt.exit_code = AttemptState.ENDED, now, observation.exit_code
    if facts is None or attempt.pk not in facts.attempts_ended:
        attempt.save(update_fields=["state", "ended_at", "exit_code"])
    attempt_pk, job_public_id = attempt.pk, job.public_id
    after.append(lambda: end_attempt_sandboxes(attempt_pk, job_public_id))
    outcome = decide(
        observation,
        attempt_number=attempt.number,
        outcome=attempt.outcome,
        engine_error=attempt.outcome_error,
        stop_reason=attempt.stop_reason,
        cancelling=job.status == S.CANCELLING,
        crash_count=job.crash_count,
        max_restarts=job.spec.get("max_restarts", 0),
        max_runtime_minutes=job.spec.get("max_runtime_minutes"),
        job_id=job.public_id,
    )
    # Nothing will complete this attempt's uploads any more (its spool was delivered first).
    if facts is None or (job.pk, attempt.number) in facts.uploading_checkpoints:
        fail_unfinished(CHECKPOINT, job=job, attempt_number=attempt.number)
    if facts is None or (job.pk, attempt.number) in facts.uploading_adapters:
        fail_unfinished(ADAPTER, job=job, attempt_number=attempt.number)
    if outcome.to == S.SUCCEEDED and job.kind == JobKind.EVALUATION:
        outcome = incomplete_evaluation(
            outcome, missing_evaluation_samples(job), attempt_number=attempt.number, crash_count=job.crash_count,
            max_restarts=job.spec.get("max_restarts", 0), job_id=job.public_id,
        )
    elif outcome.to == S.SUCCEEDED:
        record_missing_data(job, attempt, facts)
    if outcome.crashes is not None:
        Job.objects.unscoped().filter(pk=job.pk).update(crash_count=outcome.crashes)
        job.crash_count = outcome.crashes
    if outcome.park:
        park(attempt, launcher)
    error_message = outcome.error_message
    if outcome.error_code == ErrorCode.SPEND_LIMIT_REACHED and not error_message:
        error_message = spend_limit_stop_message(job.project.organization_id)
    job_transition(
        job=job, current=True, to=outcome.to, reason=outcome.reason, error_code=outcome.error_code,
        error_message=error_message, message=outcome.message,
        data={"attempt": attempt.number, "exit_code": outcome.exit_code, **outcome.data},
    )
    if not outcome.park:  # a parked JobSet waits in Kueue for the next attempt
        handle = attempt.handle
        after.append(lambda: launcher.cleanup(handle))
    dispatch.enqueue_admission()


def signal_if_due(attempt: JobAttempt, launcher, now, after: list[Callable[[], None]]) -> None:
    """Escalate a requested stop: SIGTERM after the grace period, SIGKILL after another (sent
    once the caller's lock is released, through ``after``)."""
    handle = attempt.handle
    if attempt.stop_requested_at is None:
        return
    if attempt.terminate_sent_at is None:
        if now - attempt.stop_requested_at >= timedelta(seconds=settings.LAB_STOP_GRACE_S):
            JobAttempt.objects.filter(pk=attempt.pk).update(terminate_sent_at=now)
            after.append(lambda: launcher.cancel(handle))
    elif now - attempt.terminate_sent_at >= timedelta(seconds=settings.LAB_KILL_GRACE_S):
        after.append(lambda: launcher.cancel(handle, force=True))


def end_attempt_sandboxes(attempt_pk: int, job_public_id: str) -> None:
    """Delete the sandboxes the attempt's engine made (their usage closes on the ledger, billed to
    the job) and raise the job's usage totals to the ledger's, their cost included."""
    if sandbox_end_for_attempt(attempt_id=attempt_pk):
        raise_usage_totals({job_public_id})


def deliver_spool_of_exited(job_id: int, attempt: JobAttempt, launcher) -> None:
    """Before an exited attempt's outcome is applied, store what its engine left unsent in its
    spool (``jobs.ingest.spool``), outside the job's lock: each batch locks it on its own. What
    the spool held that Lab had to refuse is told in a ``job.data_incomplete`` warning."""
    workdir = launcher.engine_workdir(attempt.handle)
    if workdir is None:
        return
    delivery = deliver_attempt_spool(attempt=attempt, workdir=workdir)
    if delivery.complete:
        return
    refused = ", ".join(f"{count} {stream}" for stream, count in sorted(delivery.refused.items()))
    with transaction.atomic():
        job = Job.objects.unscoped().select_for_update().get(pk=job_id)
        job_record_event(
            job=job,
            type=EventType.DATA_INCOMPLETE,
            level=EventLevel.WARNING,
            message=f"Attempt {attempt.number} left reports Lab could not store: {refused}.",
            data={"attempt": attempt.number, "refused": delivery.refused, "problems": delivery.problems[:20]},
        )


def record_missing_data(job: Job, attempt: JobAttempt, facts: EndedFacts | None = None) -> None:
    """On success, check that every step's metrics and the final checkpoint arrived; a
    ``job.data_incomplete`` warning names what did not (the job still succeeds: it trained).
    With ``facts``, the metrics are read only when some steps but not all arrived, and the final
    checkpoint not at all."""
    stored_count = facts.stored_steps.get(job.pk, 0) if facts is not None else None
    if stored_count == job.max_steps:
        missing_steps = []
    elif stored_count == 0:
        missing_steps = list(range(1, job.max_steps + 1))
    else:
        stored = set(MetricStep.objects.filter(job=job, step__lte=job.max_steps).values_list("step", flat=True))
        missing_steps = sorted(set(range(1, job.max_steps + 1)) - stored)
    final_status = (
        facts.final_status.get(job.pk) if facts is not None
        else job.checkpoints.filter(step=job.max_steps).order_by("-attempt").values_list("status", flat=True).first()
    )
    final_ready = final_status == CheckpointStatus.READY
    if not missing_steps and final_ready:
        return
    problems = []
    if missing_steps:
        problems.append(f"metrics of {len(missing_steps)} steps ({_ranges(missing_steps)})")
    if not final_ready:
        problems.append(f"the final checkpoint (step {job.max_steps}, {final_status or 'never registered'})")
    job_record_event(
        job=job,
        type=EventType.DATA_INCOMPLETE,
        level=EventLevel.WARNING,
        message=f"The job finished, but Lab never received {' and '.join(problems)}.",
        data={
            "attempt": attempt.number,
            "missing_metric_steps": _ranges(missing_steps),
            "final_checkpoint": final_status,
        },
    )


def _ranges(steps: list[int]) -> str:
    """Write sorted steps as ranges: ``[1, 2, 3, 7]`` → ``"1-3, 7"``."""
    parts: list[str] = []
    for step in steps:
        if parts and int(parts[-1].split("-")[-1]) == step - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{step}"
        else:
            parts.append(str(step))
    return ", ".join(parts)
