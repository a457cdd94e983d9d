"""The reconciler: turns what launchers observe into job status changes (docs/api.md "Engine exit codes").

Runs per job (after an engine's ``finish`` or a cancel) and as a periodic pass over every active
job. Idempotent: each step checks the current state under the job's row lock.

| exit | Lab |
|---|---|
| 0 | ``succeeded`` |
| 2 | ``failed`` with the engine's error (default ``invalid_spec``), never retried |
| 3 | a stop Lab asked for ends as asked (cancel → ``cancelled``, runtime → ``failed``
       ``max_runtime_exceeded``, credit → ``failed`` ``insufficient_credit``, the monthly
       spend limit → ``failed`` ``spend_limit_reached``); otherwise
       (preemption) ``queued`` again to resume |
| 4, OOM | ``failed`` (``oom``) |
| other, killed, lost | ``queued`` to resume, up to ``max_restarts``; then ``failed``
       (``max_restarts_exceeded``) |
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, FloatField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from billing.accounts import Blocker, spend_limit_stop_message
from billing.ledger import (
    AttemptUsage,
    interval_seconds,
    job_usage_totals,
    job_usage_totals_many,
    next_closings,
    organizations_exhausted,
    usage_close,
    usage_close_many,
)
from billing.pricing import micro_to_usd
from jobs import dispatch, storage
from jobs.adapters import adapter_fail_unfinished
from jobs.checkpoints import checkpoint_fail_unfinished, checkpoint_resume_archive
from jobs.environment_packages import launch_packages
from jobs.events import events_recorded_together, job_record_event
from jobs.ingest.spool import deliver_attempt_spool
from jobs.ingest.tokens import bootstrap_token, job_token
from jobs.launchers.base import (
    AttemptPhase,
    CapturedLine,
    Launcher,
    LauncherUnavailable,
    LaunchRequest,
    Observation,
)
from jobs.launchers.registry import get_launcher
from jobs.models import (
    ACTIVE_STATUSES,
    Adapter,
    AdapterStatus,
    AttemptState,
    Checkpoint,
    CheckpointStatus,
    ErrorCode,
    EventLevel,
    EventType,
    Job,
    JobAttempt,
    JobPriority,
    JobStatus,
    LogSource,
    MetricStep,
    StatusReason,
    StopReason,
)
from jobs.parking import PARKED, parked_attempts
from jobs.pool import cluster_inventory_refresh
from jobs.queue import kueue_places_forget, kueue_places_record
from jobs.readmission import attempt_unpark
from jobs.secrets.services import engine_secrets
from jobs.serializers import latest_ready_checkpoints_read_once
from jobs.services import attempt_request_stop, current_attempt, job_transition, store_log_lines
from jobs.webhooks.outbox import endpoints_read_once
from lab.lib import locks
from lab.lib.locks import advisory_lock

logger = logging.getLogger(__name__)
S = JobStatus

#: A pending attempt whose launch task has not run after this long gets its launch re-enqueued.
RELAUNCH_AFTER = timedelta(seconds=30)
#: Active jobs observed at once by one periodic pass (one launcher call per batch where it can).
RECONCILE_BATCH = 200
#: Launcher reasons that end a job for good: a cluster that cannot run it (docs/api.md "Statuses": error codes).
LAUNCHER_FAILURES = frozenset({ErrorCode.IMAGE_PULL_FAILED, ErrorCode.UNSCHEDULABLE, ErrorCode.MAX_RUNTIME_EXCEEDED})
#: Why a launched attempt waits that a starting job shows as its ``status_reason`` (Kueue's word).
WAITING_REASONS = frozenset({StatusReason.KUEUE_PENDING, StatusReason.KUEUE_INADMISSIBLE})
#: The exit code an engine's ``finish`` report stands for once its process is gone without one.
OUTCOME_EXIT_CODES = {"succeeded": 0, "failed": 2, "stopped": 3}


def launch_request(attempt: JobAttempt) -> LaunchRequest:
    """Return what the launcher needs to start ``attempt`` (its job, project and resume point loaded).

    A resume archive on this machine is first found unchanged since its checkpoint became ready;
    LabError ``checkpoint_corrupted`` (the checkpoint is then failed) or ``not_found`` when it is not
    (``jobs.checkpoints.checkpoint_resume_archive``), which fails the launch."""
    job = attempt.job
    resume = attempt.resume_from
    organization = job.project.organization.slug
    return LaunchRequest(
        job_id=job.public_id,
        attempt=attempt.number,
        spec=job.spec,
        lab_url=settings.LAB_PUBLIC_URL,
        token=job_token(attempt),
        resume_archive=checkpoint_resume_archive(resume) if resume is not None and storage.is_filesystem() else None,
        resume_checkpoint_id=resume.public_id if resume is not None and not storage.is_filesystem() else None,
        organization=organization,
        project=job.project.slug,
        namespace=settings.LAB_K8S_NAMESPACE or f"lab-{organization}",
        priority=JobPriority(job.priority).label,
        gpu_type=job.gpu_type,
        gpus=job.gpus,
        environments=tuple(env.get("id", "") for env in job.spec.get("env", []) if isinstance(env, dict)),
        environment_packages=launch_packages(job),
        secrets=engine_secrets(job_id=job.public_id),
        bootstrap_token=bootstrap_token(attempt),
    )


def attempt_launch(*, attempt_id: int) -> None:
    """Launch a pending attempt through the configured launcher; a no-op once launched.

    No row is locked while the launcher works (on a cluster that is API round trips): the
    attempt is checked, launched, and the handle recorded only if the attempt is still pending;
    if it was cancelled meanwhile, what was launched is stopped again. A launcher error fails
    the job with ``internal_error``.
    """
    launcher = get_launcher()
    with advisory_lock(locks.LAUNCH, attempt_id, wait=False) as claimed:
        if not claimed:
            return
        attempt = (
            JobAttempt.objects.select_related("job__project__organization", "resume_from")
            .filter(pk=attempt_id, state=AttemptState.PENDING)
            .first()
        )
        if attempt is None or attempt.job.status != S.STARTING or attempt.job.attempt != attempt.number:
            return
        try:
            handle = launcher.launch(launch_request(attempt))
        except LauncherUnavailable:  # e.g. the cluster API is down: the attempt stays pending, relaunched later
            logger.warning("launcher unavailable; launch postponed", extra={"job": attempt.job.public_id})
            return
        except Exception as exc:  # the launcher's failure ends this job, not the worker
            logger.exception("launch failed", extra={"job": attempt.job.public_id, "attempt": attempt.number})
            with transaction.atomic():
                job = Job.objects.unscoped().select_for_update().get(pk=attempt.job_id)
                if JobAttempt.objects.filter(pk=attempt_id, state=AttemptState.PENDING).update(
                    state=AttemptState.ENDED, ended_at=timezone.now()
                ) and job.status == S.STARTING:
                    job_transition(
                        job=job, to=S.FAILED, error_code=ErrorCode.INTERNAL_ERROR, error_message=f"Launch failed: {exc}"
                    )
                dispatch.enqueue_admission()
            return
        recorded = JobAttempt.objects.filter(pk=attempt_id, state=AttemptState.PENDING).update(
            state=AttemptState.LAUNCHED, handle=handle, launched_at=timezone.now()
        )
        if not recorded:  # cancelled while launching: stop what was started
            launcher.cancel(handle, force=True)
            launcher.cleanup(handle)


def _record_usage(job: Job, attempt: JobAttempt, observation: Observation, now) -> None:
    """Close the attempt's due usage intervals in the billing ledger (launcher times: the
    observation's, else the launch time; nothing while the launcher has not started it), set the
    job's totals from the ledger, and ask a running attempt to stop when its organization has
    nothing left to spend (for its monthly spend limit, else for credit)."""
    started_at = observation.started_at or attempt.launched_at
    if observation.phase == AttemptPhase.PENDING or started_at is None:
        return
    ended = observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST)
    result = usage_close(
        usage=AttemptUsage(
            organization_id=job.project.organization_id,
            project_id=job.project_id,
            job_public_id=job.public_id,
            attempt_id=attempt.pk,
            attempt_number=attempt.number,
            resource_type=job.gpu_type,
            gpus=job.gpus,
            started_at=started_at,
            ended_at=(observation.ended_at or now) if ended else None,
        ),
        now=now,
    )
    if result.closed:  # the totals change only with the ledger (whoever closed an interval set them)
        totals = job_usage_totals(job.public_id)
        job.gpu_seconds, job.cpu_seconds = float(totals.gpu_seconds), float(totals.cpu_seconds)
        job.cost_usd = micro_to_usd(totals.cost_micro_usd)
        Job.objects.unscoped().filter(pk=job.pk).update(
            cpu_seconds=job.cpu_seconds, gpu_seconds=job.gpu_seconds, cost_usd=job.cost_usd
        )
    if result.exhausted and not ended and not attempt.stop_reason:
        spend_limit = result.used_up == Blocker.SPEND_LIMIT_REACHED
        attempt_request_stop(job=job, reason=StopReason.SPEND_LIMIT if spend_limit else StopReason.CREDIT)
        attempt.refresh_from_db()


def _close_due_usage(attempts: list[_Launched], seen: dict[int, _Seen], now) -> dict[int, datetime]:
    """Close the due usage intervals of a batch's running attempts in one ledger transaction
    (``usage_close_many``; launcher times as ``_record_usage`` takes them), holding no job lock,
    and raise their jobs' usage totals to the ledger's. Return when the next interval of each
    running attempt ends, by attempt pk (``next_closings``: one read of the ledger, moved on past
    what this closing recorded), for ``_idle_jobs``.

    An organization whose billing account another closing holds is skipped, not waited for: its
    jobs stay due, so the pass applies them one by one (``_record_usage``), as it does attempts
    that ended and organizations with nothing left to spend. A failure of the closing is logged
    and leaves the same work to those.
    """
    running = {}
    for attempt in attempts:
        look = seen.get(attempt.job_id)
        if look is not None and look.observation.phase == AttemptPhase.RUNNING:
            running[attempt.pk] = (attempt, look.observation.started_at or attempt.launched_at)
    closings = next_closings({attempt_id: started_at for attempt_id, (_, started_at) in running.items()})
    due = [(attempt, started_at) for attempt_id, (attempt, started_at) in running.items() if closings[attempt_id] <= now]
    if not due:
        return closings
    try:
        jobs = Job.objects.unscoped().filter(pk__in=[attempt.job_id for attempt, _ in due]).values(
            "pk", "public_id", "gpu_type", "gpus", "project_id", "project__organization_id"
        )
        by_pk = {job["pk"]: job for job in jobs}
        usages = []
        for attempt, started_at in due:
            job = by_pk[attempt.job_id]
            usages.append(AttemptUsage(
                organization_id=job["project__organization_id"], project_id=job["project_id"],
                job_public_id=job["public_id"], attempt_id=attempt.pk, attempt_number=attempt.number,
                resource_type=job["gpu_type"], gpus=job["gpus"], started_at=started_at,
            ))
        result = usage_close_many(usages=usages, now=now, skip_locked=True)
        for interval in result.closed:  # a running attempt closes whole intervals: its next one follows the newest
            closings[interval.attempt_id] = max(closings[interval.attempt_id], interval.ended_at + interval_seconds())
        _raise_usage_totals({interval.job_public_id for interval in result.closed})
    except Exception:
        logger.exception("closing a batch's usage intervals failed")
    return closings


def _raise_usage_totals(job_public_ids: set[str]) -> dict[str, tuple[float, float, Decimal]]:
    """Set the usage totals of the jobs ``job_public_ids`` to their ledger sums, in one
    ``UPDATE ... FROM`` a ``VALUES`` list, taking no lock first. The ledger only grows, so a job
    whose totals are already past these (another closing wrote newer ones meanwhile) is left as
    it is. Return the totals written, ``(gpu_seconds, cpu_seconds, cost_usd)`` by job public id.

    The statement runs on PostgreSQL and SQLite alike (SQLite 3.35+: ``UPDATE ... FROM``,
    ``RETURNING``): the values are a named CTE typed with standard ``CAST``s, since SQLite has
    neither ``::`` casts nor column names on a ``FROM`` subquery's alias, and ``RETURNING``
    names only the job's own column, unqualified, as SQLite wants it."""
    totals = job_usage_totals_many(job_public_ids)
    if not totals:
        return {}
    rows, params, written = [], [], {}
    for public_id, sums in sorted(totals.items()):
        rows.append("(%s, CAST(%s AS double precision), CAST(%s AS double precision), CAST(%s AS numeric))")
        written[public_id] = (float(sums.gpu_seconds), float(sums.cpu_seconds), micro_to_usd(sums.cost_micro_usd))
        params += [public_id, *written[public_id]]
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH totals(job_public_id, gpu, cpu, cost) AS (VALUES {', '.join(rows)}) "
            f"UPDATE {table} AS job SET gpu_seconds = totals.gpu, cpu_seconds = totals.cpu, cost_usd = totals.cost "
            "FROM totals WHERE job.public_id = totals.job_public_id AND job.gpu_seconds <= totals.gpu "
            "AND job.cpu_seconds <= totals.cpu AND job.cost_usd <= totals.cost RETURNING public_id",
            params,
        )
        return {public_id: written[public_id] for (public_id,) in cursor.fetchall()}


def _store_captured(job: Job, attempt: JobAttempt, seen: _Seen) -> None:
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


def _finish_attempt(
    job: Job, attempt: JobAttempt, observation: Observation, now, after: list[Callable[[], None]],
    facts: _EndedFacts | None = None,
) -> None:
    """Apply the exit-code table to an attempt that ended (the caller holds the job's lock);
    the launcher's cleanup is queued on ``after``, to run once the lock is released. ``facts``
    (read for a whole batch under the same lock, ``_read_ended_facts``) spare the reads of
    uploads and of a succeeded job's data where they show there is nothing to do, and the
    write of an attempt the batch ended already (``_end_attempts``)."""
    attempt.state, attempt.ended_at, attempt.exit_code = AttemptState.ENDED, now, observation.exit_code
    if facts is None or attempt.pk not in facts.attempts_ended:
        attempt.save(update_fields=["state", "ended_at", "exit_code"])
    code = observation.exit_code if observation.exit_code is not None else _implied_exit_code(observation, attempt)
    engine_error = attempt.outcome_error or {}
    detail = {"attempt": attempt.number, "exit_code": code}
    # Nothing will complete this attempt's uploads any more (its spool was delivered first).
    if facts is None or (job.pk, attempt.number) in facts.uploading_checkpoints:
        checkpoint_fail_unfinished(job=job, attempt_number=attempt.number)
    if facts is None or (job.pk, attempt.number) in facts.uploading_adapters:
        adapter_fail_unfinished(job=job, attempt_number=attempt.number)
    if code == 0:
        _record_missing_data(job, attempt, facts)
        job_transition(job=job, current=True, to=S.SUCCEEDED, message="Finished all steps.", data=detail)
    elif code == 2:
        job_transition(
            job=job, current=True,
            to=S.FAILED,
            error_code=engine_error.get("code") or "invalid_spec",
            error_message=engine_error.get("message") or observation.detail[-2000:],
            data=detail,
        )
    elif code == 3 and (attempt.stop_reason or job.status == S.CANCELLING):
        reason = attempt.stop_reason or StopReason.CANCEL
        if reason == StopReason.CANCEL:
            job_transition(job=job, current=True, to=S.CANCELLED, message="Stopped after a checkpoint, as requested.", data=detail)
        elif reason == StopReason.RUNTIME:
            job_transition(
                job=job, current=True,
                to=S.FAILED,
                error_code=ErrorCode.MAX_RUNTIME_EXCEEDED,
                error_message=f"The job ran longer than max_runtime_minutes ({job.spec['max_runtime_minutes']}).",
                data=detail,
            )
        elif reason == StopReason.SPEND_LIMIT:
            job_transition(
                job=job, current=True,
                to=S.FAILED,
                error_code=ErrorCode.SPEND_LIMIT_REACHED,
                error_message=spend_limit_stop_message(job.project.organization_id),
                data=detail,
            )
        else:
            job_transition(
                job=job, current=True, to=S.FAILED, error_code=ErrorCode.INSUFFICIENT_CREDIT, error_message="Out of credit.", data=detail
            )
    elif code == 3 and observation.kept_in_queue:
        # Kueue requeued the same Workload at its place: keep the JobSet for the next attempt,
        # which its pod opens when Kueue readmits it (jobs.readmission); admission leaves it be.
        attempt.handle = {**get_launcher().handle_for_readmission(attempt.handle), PARKED: True}
        attempt.save(update_fields=["handle"])
        job_transition(
            job=job, current=True, to=S.QUEUED, reason=StatusReason.REQUEUED_AFTER_PREEMPTION,
            message="Preempted; waiting in Kueue at its place to resume from the latest checkpoint.",
            data={**detail, "kept_in_queue": True},
        )
        dispatch.enqueue_admission()
        return
    elif code == 3:
        job_transition(
            job=job,
            current=True,
            to=S.QUEUED,
            reason=StatusReason.REQUEUED_AFTER_PREEMPTION,
            message="Stopped from outside; requeued.",
            data=detail,
        )
    elif observation.reason in LAUNCHER_FAILURES and job.status != S.CANCELLING:
        job_transition(
            job=job, current=True, to=S.FAILED, error_code=observation.reason, error_message=observation.detail[-2000:], data=detail
        )
    elif code == 4 or observation.oom_killed:
        job_transition(
            job=job, current=True, to=S.FAILED, error_code=ErrorCode.OOM, error_message="The engine ran out of memory.", data=detail
        )
    elif job.status == S.CANCELLING:
        job_transition(job=job, current=True, to=S.CANCELLED, message="Stopped, as requested.", data=detail)
    else:
        crashes = job.crash_count + 1
        Job.objects.unscoped().filter(pk=job.pk).update(crash_count=crashes)
        job.crash_count = crashes
        max_restarts = job.spec["max_restarts"]
        what = observation.detail.strip().splitlines()[-1:] or ["no output"]
        if crashes > max_restarts:
            job_transition(
                job=job, current=True,
                to=S.FAILED,
                error_code=ErrorCode.MAX_RESTARTS_EXCEEDED,
                error_message=f"The engine crashed {crashes} times (exit {code}): {what[0][:500]}",
                data=detail,
            )
        else:
            job_transition(
                job=job, current=True,
                to=S.QUEUED,
                reason=StatusReason.REQUEUED_AFTER_CRASH,
                message=f"Attempt {attempt.number} crashed (exit {code}); resuming from the latest checkpoint.",
                data={**detail, "crashes": crashes},
            )
    handle = attempt.handle
    after.append(lambda: get_launcher().cleanup(handle))
    dispatch.enqueue_admission()


def _show_waiting_reason(job: Job, observation: Observation) -> None:
    """Set a starting job's ``status_reason`` to why its launched attempt waits, in the words the
    launcher read from the cluster (``kueue_pending``, ``kueue_inadmissible``: the Workload's
    ``QuotaReserved=False`` condition; docs/api.md "Statuses"), or clear it once it waits for
    nothing of the kind; one UPDATE only when it changes."""
    reason = observation.reason if observation.reason in WAITING_REASONS else ""
    if reason != job.status_reason:
        Job.objects.unscoped().filter(pk=job.pk, status=S.STARTING).update(status_reason=reason)
        job.status_reason = reason


def _implied_exit_code(observation: Observation, attempt: JobAttempt) -> int | None:
    """Return the exit code an attempt that left none stands for: a preemption (a Kueue eviction,
    a disrupted pod) is a stop from outside (3); an attempt whose process is gone after its engine
    reported ``finish`` (a JobSet removed after it ended) ended as reported; else None."""
    if observation.reason == "preempted":
        return 3
    if observation.phase == AttemptPhase.LOST and attempt.outcome:
        return OUTCOME_EXIT_CODES.get(attempt.outcome)
    return None


def _signal_if_due(attempt: JobAttempt, launcher, now, after: list[Callable[[], None]]) -> None:
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


def _deliver_spool_of_exited(job_id: int, attempt: JobAttempt, launcher) -> None:
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


def _record_missing_data(job: Job, attempt: JobAttempt, facts: _EndedFacts | None = None) -> None:
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


@dataclass
class _Seen:
    """What the launcher said of one launched attempt, asked while no row was locked."""

    attempt_id: int
    observation: Observation
    lines: list[CapturedLine]
    handle: dict
    handle_changed: bool = False


def _look(launcher, attempts: list[_Launched]) -> dict[int, _Seen]:
    """Observe ``attempts`` (launched ones) and read their captured output, holding no lock."""
    observations = launcher.observe_many([attempt.handle for attempt in attempts])
    # A launcher that captures no output (Launcher's own captured_lines) notes no progress in a
    # handle: its handles are not copied to be compared.
    captures = type(launcher).captured_lines is not Launcher.captured_lines
    seen = {}
    for attempt, observation in zip(attempts, observations):
        if not captures:
            seen[attempt.job_id] = _Seen(attempt.pk, observation, [], attempt.handle)
            continue
        handle = copy.deepcopy(attempt.handle)
        lines = launcher.captured_lines(handle)
        seen[attempt.job_id] = _Seen(attempt.pk, observation, lines, handle, handle != attempt.handle)
    return seen


@dataclass(frozen=True, slots=True)
class _Launched:
    """A launched current attempt as a pass reads it (``_launched_attempts``): the attempt's own
    fields, and of its job the status, start, organization and the spec's
    ``max_runtime_minutes`` (minutes)."""

    pk: int
    job_id: int
    number: int
    handle: dict
    launched_at: datetime | None
    last_heartbeat_at: datetime | None
    stop_requested_at: datetime | None
    job_status: str
    job_started_at: datetime | None
    organization_id: int
    max_runtime_minutes: float | None


def _launched_attempts(job_ids: list[int]) -> list[_Launched]:
    """Return the current attempt of each of ``job_ids`` that is launched, with what a pass reads
    of its job (one query, rows rather than model instances: a pass reads 1,000 of them); the
    spec itself, the largest column, is left in the database."""
    rows = (
        JobAttempt.objects.filter(job_id__in=job_ids, state=AttemptState.LAUNCHED, number=F("job__attempt"))
        .annotate(max_runtime_minutes=Cast(KeyTextTransform("max_runtime_minutes", "job__spec"), FloatField()))
        .values_list("pk", "job_id", "number", "handle", "launched_at", "last_heartbeat_at", "stop_requested_at",
                     "job__status", "job__started_at", "job__project__organization_id", "max_runtime_minutes")
    )
    return [_Launched(*row) for row in rows]


def _idle_jobs(attempts: list[_Launched], seen: dict[int, _Seen], closings: dict[int, datetime], now) -> set[int]:
    """Return the ids of the jobs for which ``_apply`` would do nothing now, so a pass skips
    their lock: running, its attempt still running with no captured output (nor read progress),
    no stop asked, heard from within the heartbeat timeout, inside its runtime, no usage
    interval due (``closings``: when each running attempt's next interval ends, as
    ``_close_due_usage`` returns them) and its organization not out of credit. Read without
    locks; a job wrongly left out is applied."""
    candidates = {}
    for attempt in attempts:
        look = seen.get(attempt.job_id)
        if (
            look is None or look.lines or look.handle_changed or look.observation.phase != AttemptPhase.RUNNING
            or attempt.job_status != S.RUNNING or attempt.stop_requested_at is not None or attempt.job_started_at is None
        ):
            continue
        started_at = look.observation.started_at or attempt.launched_at
        last_sign_of_life = attempt.last_heartbeat_at or max(attempt.launched_at, started_at)
        if now - last_sign_of_life > timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S):
            continue
        if now - attempt.job_started_at > timedelta(minutes=attempt.max_runtime_minutes):
            continue
        candidates[attempt.pk] = (attempt, started_at)
    if not candidates:
        return set()
    exhausted = organizations_exhausted(attempt.organization_id for attempt, _ in candidates.values())
    return {
        attempt.job_id
        for attempt_id, (attempt, _) in candidates.items()
        if closings[attempt_id] > now and attempt.organization_id not in exhausted
    }


def reconcile_job(*, job_id: int, seen: _Seen | None = None) -> None:
    """Bring one active job in line with what its launcher observes.

    The launcher is asked first, with no row locked (``seen`` when the caller asked already);
    then the job is locked briefly to apply what it said, and the signals it calls for are sent
    after the lock is released.
    """
    launcher = get_launcher()
    if seen is None:
        seen = _look(launcher, _launched_attempts([job_id])).get(job_id)
    if (seen is not None and seen.observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST)
            and launcher.engine_workdir(seen.handle) is not None):  # a spool Lab can read (not on a cluster)
        attempt = JobAttempt.objects.filter(pk=seen.attempt_id, state=AttemptState.LAUNCHED).first()
        if attempt is not None:
            _deliver_spool_of_exited(job_id, attempt, launcher)
    after: list[Callable[[], None]] = []
    with transaction.atomic():
        _apply(job_id, seen, launcher, after)
    for action in after:
        try:
            action()
        except Exception:  # a signal that fails is sent again at the next pass
            logger.exception("launcher action failed", extra={"job_pk": job_id})


def _lock_active(job_id: int) -> tuple[Job | None, JobAttempt | None]:
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


def _apply(job_id: int, seen: _Seen | None, launcher, after: list[Callable[[], None]]) -> None:
    """Apply what was seen of ``job_id``'s attempt under the job's lock."""
    job, attempt = _lock_active(job_id)
    if job is None:
        return
    _apply_locked(job, attempt, seen, launcher, after, timezone.now())


def _apply_locked(
    job: Job, attempt: JobAttempt | None, seen: _Seen | None, launcher, after: list[Callable[[], None]], now,
    facts: _EndedFacts | None = None,
) -> None:
    """Apply what was seen of an active ``job``'s current ``attempt`` (the caller holds the job's
    lock); ``facts`` as ``_finish_attempt`` takes them, and an ended attempt whose usage they
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
    _store_captured(job, attempt, seen)
    observation = seen.observation
    if observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST):
        if facts is None or attempt.pk not in facts.usage_closed:
            _record_usage(job, attempt, observation, now)
        _finish_attempt(job, attempt, observation, now, after, facts)
        return
    _record_usage(job, attempt, observation, now)
    if observation.phase == AttemptPhase.PENDING and job.status == S.STARTING:
        _show_waiting_reason(job, observation)
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
    _signal_if_due(attempt, launcher, now, after)


@dataclass
class _EndedFacts:
    """What finishing a batch of ended attempts reads, read once for all of them under their
    jobs' locks (``_read_ended_facts``)."""

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
    #: the attempts the batch ended already (``_end_attempts``).
    attempts_ended: set[int] = field(default_factory=set)


def _read_ended_facts(locked: list[JobAttempt]) -> _EndedFacts:
    """Read the ``_EndedFacts`` of the locked current attempts ``locked`` (jobs loaded): one
    query each for checkpoints, adapters and metrics, one for the final checkpoints."""
    current = {attempt.job_id: attempt.number for attempt in locked}

    def uploading(model, status) -> set[tuple[int, int]]:
        rows = model.objects.filter(job_id__in=current, status=status).values_list("job_id", "attempt").distinct()
        return {(job_id, number) for job_id, number in rows if current[job_id] == number}

    stored = (
        MetricStep.objects.filter(job_id__in=current, step__gte=1, step__lte=F("job__max_steps"))
        .values("job_id").annotate(steps=Count("pk")).values_list("job_id", "steps")
    )
    finals: dict[int, str] = {}
    for job_id, status in (
        Checkpoint.objects.filter(job_id__in=current, step=F("job__max_steps"))
        .order_by("job_id", "-attempt").values_list("job_id", "status")
    ):
        finals.setdefault(job_id, status)
    return _EndedFacts(
        uploading_checkpoints=uploading(Checkpoint, CheckpointStatus.UPLOADING),
        uploading_adapters=uploading(Adapter, AdapterStatus.UPLOADING),
        stored_steps=dict(stored),
        final_status=finals,
        usage_closed=set(),
    )


def _close_ended_usage(locked: list[JobAttempt], seen: dict[int, _Seen], now) -> set[int]:
    """Close the due usage intervals of the locked ended attempts ``locked`` in one ledger
    transaction (launcher times, as ``_record_usage`` takes them) and raise their jobs' totals
    to the ledger's sums, on the loaded jobs too (they stay the rows as they are, for
    ``job_transition(current=True)``); return the pks of the attempts so handled. On a failure
    (logged) nothing is returned: each attempt's usage is then closed on its own
    (``_record_usage``)."""
    usages, handled = [], set()
    for attempt in locked:
        look = seen[attempt.job_id]
        if look.attempt_id != attempt.pk or attempt.state != AttemptState.LAUNCHED:
            continue  # not the attempt that was seen ending: _apply_locked leaves it alone
        handled.add(attempt.pk)
        started_at = look.observation.started_at or attempt.launched_at
        if started_at is None:
            continue
        job = attempt.job
        usages.append(AttemptUsage(
            organization_id=job.project.organization_id, project_id=job.project_id, job_public_id=job.public_id,
            attempt_id=attempt.pk, attempt_number=attempt.number, resource_type=job.gpu_type, gpus=job.gpus,
            started_at=started_at, ended_at=look.observation.ended_at or now,
        ))
    try:
        with transaction.atomic():
            result = usage_close_many(usages=usages, now=now)
            totals = _raise_usage_totals({interval.job_public_id for interval in result.closed})
    except Exception:
        logger.exception("closing the usage of a batch's ended attempts failed")
        return set()
    for attempt in locked:
        job = attempt.job
        if job.public_id in totals:
            job.gpu_seconds, job.cpu_seconds, job.cost_usd = totals[job.public_id]
    return handled


#: How many of a batch's jobs may fail to finish (each rolling the batch back, which is then
#: applied again without them) before the rest are left to ``reconcile_job`` one by one.
FINISH_FAILURES_PER_BATCH = 3


class _JobNotFinished(Exception):
    """Applying one job of a batch of ended ones failed (the cause is chained)."""

    def __init__(self, job_id: int):
        super().__init__(f"job pk {job_id}")
        self.job_id = job_id


def _finish_ended(job_ids: list[int], seen: dict[int, _Seen], launcher) -> list[int]:
    """Apply what was seen of the jobs ``job_ids``, whose attempts ended (exited or lost, with no
    spool to deliver first), in one transaction (``_finish_together``). A job that fails to
    finish (logged; the next pass tries again) rolls the transaction back, and the batch is
    applied again without it, so it leaves the others applied; after
    ``FINISH_FAILURES_PER_BATCH`` such jobs, or when the batch fails otherwise, the rest are left
    to ``reconcile_job``. The launcher's cleanups run once the locks are released. Returns the
    jobs left for ``reconcile_job``: those not locked here (no longer active, or without a
    current attempt), or all but the failed ones when the batch could not be applied."""
    failed: set[int] = set()
    while True:
        todo = [job_id for job_id in job_ids if job_id not in failed]
        try:
            done, after = _finish_together(todo, seen, launcher)
            break
        except _JobNotFinished as broken:  # one broken job must not stop the others from being applied
            logger.error("reconcile failed", exc_info=broken.__cause__, extra={"job_pk": broken.job_id})
            failed.add(broken.job_id)
            if len(failed) < FINISH_FAILURES_PER_BATCH:
                continue
            return [job_id for job_id in todo if job_id != broken.job_id]
        except Exception:
            logger.exception("finishing a batch's ended attempts failed")
            return todo
    for action in after:
        try:
            action()
        except Exception:  # a signal that fails is sent again at the next pass
            logger.exception("launcher action failed")
    return [job_id for job_id in todo if job_id not in done]


def _finish_together(job_ids: list[int], seen: dict[int, _Seen], launcher) -> tuple[set[int], list[Callable[[], None]]]:
    """Apply what was seen of the ended jobs ``job_ids`` in one transaction: the jobs are locked
    in one query, in pk order; their usage is closed in one ledger batch, their attempts ended in
    one statement and what finishing reads is read once for all (``_read_ended_facts``; for
    their events, their projects' webhook endpoints and their latest ready checkpoints); then
    each job is applied as ``_apply`` does it, its events stored with the others' at the end
    (``events_recorded_together``). Return the jobs locked, and the launcher actions to run once
    the locks are released. Raises ``_JobNotFinished`` when one job fails (nothing is kept)."""
    after: list[Callable[[], None]] = []
    with transaction.atomic():
        now = timezone.now()
        locked = list(
            JobAttempt.objects.select_for_update(of=("job",)).select_related("job__project")
            .filter(job_id__in=job_ids, number=F("job__attempt"), job__status__in=ACTIVE_STATUSES)
            .order_by("job_id")
        )
        facts = _read_ended_facts(locked)
        facts.usage_closed = _close_ended_usage(locked, seen, now)
        facts.attempts_ended = _end_attempts(locked, seen, now)
        with (
            endpoints_read_once({attempt.job.project_id for attempt in locked}),
            # A checkpoint becomes ready only under its job's lock, which this transaction holds.
            latest_ready_checkpoints_read_once([attempt.job for attempt in locked]),
            # Their events are stored together at the end, still under the jobs' locks.
            events_recorded_together(),
        ):
            for attempt in locked:
                try:
                    _apply_locked(attempt.job, attempt, seen.get(attempt.job_id), launcher, after, now, facts)
                except Exception as exc:
                    raise _JobNotFinished(attempt.job_id) from exc
    return {attempt.job_id for attempt in locked}, after


def _end_attempts(locked: list[JobAttempt], seen: dict[int, _Seen], now) -> set[int]:
    """End, in one statement, those of the locked current attempts ``locked`` that
    ``_apply_locked`` finishes (launched, and the attempt seen ending), with the state, end
    time and exit code ``_finish_attempt`` gives them; return their pks."""
    # The loaded attempts stay launched: _apply_locked goes by them, and _finish_attempt sets these on them.
    rows, params, ended = [], [], set()
    for attempt in locked:
        look = seen.get(attempt.job_id)
        if look is None or look.attempt_id != attempt.pk or attempt.state != AttemptState.LAUNCHED:
            continue
        if look.observation.phase not in (AttemptPhase.EXITED, AttemptPhase.LOST):
            continue
        rows.append("(CAST(%s AS bigint), CAST(%s AS integer))")
        params += [attempt.pk, look.observation.exit_code]
        ended.add(attempt.pk)
    if not rows:
        return ended
    table = JobAttempt._meta.db_table
    # One UPDATE ... FROM a VALUES list (Django's bulk_update costs more to build), written to run
    # on PostgreSQL and SQLite alike, as _raise_usage_totals's.
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH ending(attempt_id, code) AS (VALUES {', '.join(rows)}) "
            f"UPDATE {table} AS attempt SET state = %s, ended_at = %s, exit_code = ending.code "
            "FROM ending WHERE attempt.id = ending.attempt_id",
            [*params, AttemptState.ENDED.value, connection.ops.adapt_datetimefield_value(now)],
        )
    return ended


def _watch_parked(launcher) -> list[dict]:
    """Look at the JobSets parked in Kueue after a preemption (``jobs.readmission``) and return
    the handles of those still waiting. One that is gone, or that ended without opening the
    job's next attempt (e.g. its readmitted pod could not pull its image), waits no more: it is
    deleted and Lab's admission starts the job again with a new JobSet."""
    attempts = parked_attempts()
    if not attempts:
        return []
    try:
        observations = launcher.observe_many([attempt.handle for attempt in attempts])
    except LauncherUnavailable:
        return [attempt.handle for attempt in attempts]
    waiting = []
    for attempt, observation in zip(attempts, observations):
        ended = observation.phase == AttemptPhase.LOST or (
            observation.phase == AttemptPhase.EXITED and not observation.kept_in_queue)
        if not ended:
            waiting.append(attempt.handle)
        elif attempt_unpark(attempt_id=attempt.pk):
            logger.warning("a parked JobSet ended before Kueue readmitted it; starting anew",
                           extra={"job": attempt.job.public_id, "detail": observation.detail})
            try:
                launcher.cleanup(attempt.handle)
            except Exception:  # the orphan sweep deletes it later
                logger.exception("deleting a parked JobSet failed", extra={"job": attempt.job.public_id})
            dispatch.enqueue_admission()
    return waiting


def _record_queue_places(launcher) -> None:
    """Record where the jobs whose attempt waits in the pool's own queue stand there (Kueue's
    visibility API on Kubernetes: one call per pass, whatever the number of jobs), for
    ``jobs.queue.queue_positions``; forget them when the launcher cannot say."""
    queue = launcher.queue_places()
    if queue is None:
        kueue_places_forget()
        return
    waiting = JobAttempt.objects.filter(
        number=F("job__attempt"), job__status__in=(S.STARTING, S.QUEUED), state__in=(AttemptState.LAUNCHED, AttemptState.ENDED)
    ).values_list("job__public_id", "handle")
    places = {}
    for public_id, handle in waiting:
        place = queue.places.get((handle.get("namespace"), handle.get("jobset")))
        if place is not None:
            places[public_id] = place
    kueue_places_record(places=places, pending=queue.pending)


def reconcile_all(*, batch_size: int = RECONCILE_BATCH) -> int:
    """Reconcile every active job, ``batch_size`` at a time (the launcher asked about a whole
    batch at once, no lock held; the batch's jobs whose attempts ended, with no spool to
    deliver, finished together by ``_finish_ended``), and end orphan engine processes; return
    how many jobs were seen."""
    launcher = get_launcher()
    job_ids = list(Job.objects.unscoped().filter(status__in=ACTIVE_STATUSES).order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(job_ids), batch_size):
        batch = job_ids[start : start + batch_size]
        try:
            attempts = _launched_attempts(batch)
            seen = _look(launcher, attempts)
            closings = _close_due_usage(attempts, seen, timezone.now())
            idle = _idle_jobs(attempts, seen, closings, timezone.now())
        except Exception:
            logger.exception("observing a batch failed")
            continue
        ended = [
            job_id for job_id in batch
            if job_id in seen and seen[job_id].observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST)
            and launcher.engine_workdir(seen[job_id].handle) is None
        ]
        left = set(_finish_ended(ended, seen, launcher)) if ended else set()
        for job_id in batch:
            if job_id in idle or (job_id in ended and job_id not in left):
                continue
            try:
                reconcile_job(job_id=job_id, seen=seen.get(job_id))
            except Exception:  # one broken job must not stop the others from being reconciled
                logger.exception("reconcile failed", extra={"job_pk": job_id})
    try:  # the pool's inventory from the cluster's nodes, for submit's checks (jobs.pool)
        cluster_inventory_refresh()
    except Exception:
        logger.exception("reading the pool's inventory failed")
    parked = _watch_parked(launcher)
    try:
        _record_queue_places(launcher)
    except Exception:  # places are for show; the pass goes on without them
        logger.exception("reading the queue's places failed")
    live = list(JobAttempt.objects.filter(state=AttemptState.LAUNCHED).values_list("handle", flat=True))
    for workdir in launcher.sweep_orphans(live + parked):
        logger.warning("ended an orphan engine process", extra={"workdir": workdir})
    return len(job_ids)
