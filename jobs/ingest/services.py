"""What the ingest API does with an engine's reports. Every write locks the job row first, so
reports of one job are applied one at a time and the attempt rule holds under concurrency.

Attempt rule (docs/ingest-api.md): a report from an attempt older than the job's current one is refused
with 409 ``stale_attempt``; a metric point is unique per (job, step): a resend from the same
attempt merges new names and counts the rest as duplicates, a point from a newer attempt replaces
an older attempt's point for that step. A job that has ended takes late reports of the steps it
reached (the job token's hour of grace), but no new checkpoint or adapter. Text the engine sends
(samples, its outcome's error) is stored with the job's secrets masked (``jobs.secrets``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from jobs import dispatch
from jobs.artifacts import lifecycle
from jobs.artifacts.kinds import ArtifactKind
from jobs.evaluation_samples import EvaluationSample, evaluation_plan
from jobs.ingest.schemas import (
    ArtifactComplete,
    ArtifactRegister,
    EvaluationSamplesBatch,
    FinishReport,
    LogsBatch,
    MetricsBatch,
    SamplesBatch,
    StatusReport,
)
from jobs.metrics import INGESTED_POINTS, INGESTED_VALUES
from jobs.models import (
    TERMINAL_STATUSES,
    Artifact,
    Job,
    JobAttempt,
    JobKind,
    JobStatus,
    LogSource,
    MetricStep,
    RolloutSample,
)
from jobs.sandboxes import job_sandbox_metrics
from jobs.secrets.services import masker
from jobs.services import job_transition, store_log_lines
from jobs.stream import records as stream_records
from jobs.stream.fanout import publish_on_commit
from lab.errors import LabError


def _locked(attempt: JobAttempt, reported_attempt: int, *, live: bool = True) -> tuple[Job, JobAttempt]:
    """Lock the job; refuse a report that is not from the token's attempt or is stale.

    Live training data from the current attempt (metrics, samples, checkpoints and adapters)
    proves it is training: a starting job becomes running. Reports Lab delivers from an exited
    engine's spool (``live=False``), log lines and the engine's end report prove nothing of the
    kind: an engine logs while it loads, and may end failing its checks before its first step.
    """
    if reported_attempt != attempt.number:
        raise LabError(
            "invalid_request",
            f"attempt {reported_attempt} does not match this token's attempt.",
            param="attempt",
        )
    job = Job.objects.unscoped().select_for_update().get(pk=attempt.job_id)
    if attempt.number < job.attempt:
        raise LabError(
            "stale_attempt",
            f"attempt {attempt.number} was superseded by attempt {job.attempt}.",
            param="attempt",
        )
    if live and job.status == JobStatus.STARTING:
        job = job_transition(job=job, to=JobStatus.RUNNING, message="The engine is training.")
    return job, JobAttempt.objects.get(pk=attempt.pk)


def should_stop(job: Job, attempt: JobAttempt) -> bool:
    """Whether Lab wants this attempt to stop (cancel, runtime, credit, superseded or finished)."""
    return (
        bool(attempt.stop_reason)
        or job.status == JobStatus.CANCELLING
        or job.status in TERMINAL_STATUSES
        or attempt.number < job.attempt
    )


@transaction.atomic
def ingest_status(*, attempt: JobAttempt, report: StatusReport) -> str:
    """Record a heartbeat; move a starting job to running once past loading. Returns the action."""
    job = Job.objects.unscoped().select_for_update().get(pk=attempt.job_id)
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    if report.attempt != attempt.number:
        raise LabError("invalid_request", "attempt does not match this token's attempt.", param="attempt")
    if attempt.number < job.attempt:
        return "stop"
    attempt.last_heartbeat_at = timezone.now()
    attempt.phase = report.phase
    attempt.save(update_fields=["last_heartbeat_at", "phase"])
    if report.step > job.step and not job.is_terminal:
        job.step = min(report.step, job.max_steps)
        job.save(update_fields=["step"])
    if job.status == JobStatus.STARTING and report.phase != "loading":
        job = job_transition(job=job, to=JobStatus.RUNNING, message="The engine is training.")
    return "stop" if should_stop(job, attempt) else "continue"


def _check_steps(job: Job, steps: set[int], what: str) -> None:
    """Refuse a batch (409 ``invalid_step``, nothing stored) naming a step the job cannot have:
    beyond ``max_steps``, or, once the job has ended, beyond the last step it reached (the hour
    of grace after the end is for late flushes of steps that happened)."""
    if not steps:
        return
    top = max(steps)
    if top > job.max_steps:
        raise LabError("invalid_step", f"{what} for step {top}: this job has {job.max_steps} steps.", param="step")
    if job.status in TERMINAL_STATUSES and top > job.step:
        raise LabError(
            "invalid_step",
            f"{what} for step {top}: this job ended at step {job.step} and takes late reports of its steps only.",
            param="step",
        )


@transaction.atomic
def ingest_metrics(*, attempt: JobAttempt, batch: MetricsBatch, live: bool = True) -> dict[str, int]:
    """Store a batch of metric points (one row per step). Returns accepted/duplicates/superseded.

    Raises LabError ``invalid_step`` for a step beyond the job's (``_check_steps``)."""
    job, attempt = _locked(attempt, batch.attempt, live=live)
    _check_steps(job, {point.step for point in batch.points}, "metrics")
    by_step: dict[int, tuple[datetime, dict[str, float]]] = {}
    for point in batch.points:
        time, values = by_step.get(point.step, (point.time, {}))
        by_step[point.step] = (time, {**point.values, **values})
    if live and by_step:  # the job's sandboxes as Lab counts them when its newest step arrives
        time, values = by_step[max(by_step)]
        by_step[max(by_step)] = (time, {**values, **job_sandbox_metrics(job)})
    existing = {row.step: row for row in MetricStep.objects.filter(job=job, step__in=list(by_step))}
    created, changed = [], []
    accepted = duplicates = superseded = 0
    for step, (time, values) in sorted(by_step.items()):
        row = existing.get(step)
        if row is None:
            created.append(MetricStep(job=job, step=step, attempt=attempt.number, time=time, values=values))
            accepted += 1
        elif row.attempt < attempt.number:
            row.attempt, row.time, row.values = attempt.number, time, values
            changed.append(row)
            superseded += 1
        else:
            new_names = {name: value for name, value in values.items() if name not in row.values}
            if new_names:
                row.values = {**row.values, **new_names}
                changed.append(row)
                accepted += 1
            else:
                duplicates += 1
    streamed = sorted(created + changed, key=lambda row: row.step)
    stream_records.number(job.pk, streamed)  # a merged or superseded step is streamed again, whole
    _insert_metric_steps(created)
    MetricStep.objects.bulk_update(changed, ["attempt", "time", "values", "stream_seq"], batch_size=1000)
    publish_on_commit(job.public_id, stream_records.metric_records(streamed))
    top = max(by_step, default=0)
    if top > job.step:
        job.step = min(top, job.max_steps)
        job.save(update_fields=["step"])
    INGESTED_POINTS.inc(len(batch.points))
    INGESTED_VALUES.inc(sum(len(point.values) for point in batch.points))
    return {"accepted": accepted, "duplicates": duplicates, "superseded": superseded}


def _insert_metric_steps(rows: list[MetricStep]) -> None:
    """Insert new metric rows in one statement.

    On PostgreSQL the batch travels as one JSON document expanded by ``jsonb_array_elements``:
    about 6x faster than ``bulk_create``'s thousands of bound parameters for 1,000 rows × 20
    values (measured: 45 ms against 300 ms). Elsewhere, ``bulk_create``.
    """
    if not rows:
        return
    if connection.vendor != "postgresql":
        MetricStep.objects.bulk_create(rows, batch_size=1000)
        return
    payload = json.dumps(
        [
            {
                "job": row.job_id,
                "step": row.step,
                "attempt": row.attempt,
                "time": row.time.isoformat(),
                "values": row.values,
                "seq": row.stream_seq,
            }
            for row in rows
        ]
    )
    table = MetricStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (job_id, step, attempt, time, "values", stream_seq)
            SELECT (p->>'job')::bigint, (p->>'step')::integer, (p->>'attempt')::integer,
                   (p->>'time')::timestamptz, p->'values', (p->>'seq')::bigint
            FROM jsonb_array_elements(%s::jsonb) AS p
            """,
            [payload],
        )


@transaction.atomic
def ingest_samples(*, attempt: JobAttempt, batch: SamplesBatch, live: bool = True) -> dict[str, int]:
    """Store rollout samples; a batch replaces any samples stored earlier for the steps it names.
    The job's secrets are masked in prompts and completions (an environment may echo one).

    Raises LabError ``invalid_step`` for a step beyond the job's (``_check_steps``)."""
    job, attempt = _locked(attempt, batch.attempt, live=live)
    steps = {sample.step for sample in batch.samples}
    _check_steps(job, steps, "samples")
    RolloutSample.objects.filter(job=job, step__in=steps).delete()
    mask = masker(job_id=job.public_id)
    rows = [
        RolloutSample(
            job=job,
            step=sample.step,
            attempt=attempt.number,
            group=sample.group,
            prompt=mask(sample.prompt),
            completion=mask(sample.completion),
            reward=sample.reward,
            advantage=sample.advantage,
            metrics=sample.metrics,
        )
        for sample in batch.samples
    ]
    stream_records.number(job.pk, rows)
    RolloutSample.objects.bulk_create(rows, batch_size=500)
    publish_on_commit(job.public_id, stream_records.sample_records(rows))
    return {"accepted": len(rows)}


@transaction.atomic
def ingest_evaluation_samples(*, attempt: JobAttempt, batch: EvaluationSamplesBatch, live: bool = True) -> dict[str, int]:
    """Store an evaluation job's samples once each (``jobs.evaluation_samples``): a sample whose
    key (environment, example, rollout) is stored already, or comes twice in the batch, counts as
    a duplicate and the first one stays. The job's secrets are masked in every text. Returns
    ``{"accepted", "duplicates"}``.

    Raises LabError ``invalid_request`` for a job that is no evaluation, 409 ``invalid_state`` once
    the job has ended (its results are counted from what it had then), and ``invalid_request``
    (nothing stored) for a sample outside the job's plan: an environment beyond its
    ``[[eval.env]]`` blocks, a rollout beyond the block's ``rollouts_per_example``, or an example
    beyond its ``num_examples`` (the block's, when it names one, must be the one reported)."""
    job, attempt = _locked(attempt, batch.attempt, live=live)
    if job.kind != JobKind.EVALUATION:
        raise LabError("invalid_request", "This job is no evaluation: it takes no evaluation samples.")
    if job.status in TERMINAL_STATUSES:
        raise LabError("invalid_state", f"This evaluation has ended ({job.status}): it takes no more samples.")
    plan = evaluation_plan(job.spec)
    for index, sample in enumerate(batch.samples):
        planned = plan[sample.environment] if sample.environment < len(plan) else None
        if (
            planned is None
            or sample.rollout >= planned.rollouts_per_example
            or sample.example >= sample.num_examples
            or (planned.num_examples is not None and sample.num_examples != planned.num_examples)
        ):
            raise LabError(
                "invalid_request",
                f"sample {index} (environment {sample.environment}, example {sample.example} of {sample.num_examples}, "
                f"rollout {sample.rollout}) is not one this evaluation plans.",
                param=f"samples.{index}",
            )
    keys = {(sample.environment, sample.example, sample.rollout) for sample in batch.samples}
    stored = set(
        EvaluationSample.objects.filter(
            job=job, environment__in={key[0] for key in keys}, example__in={key[1] for key in keys}
        ).values_list("environment", "example", "rollout")
    )
    mask = _json_masker(masker(job_id=job.public_id))
    rows = []
    for sample in batch.samples:
        key = (sample.environment, sample.example, sample.rollout)
        if key in stored:
            continue
        stored.add(key)
        rows.append(EvaluationSample(
            job=job, attempt=attempt.number, environment=sample.environment, example=sample.example,
            rollout=sample.rollout, num_examples=sample.num_examples, prompt=mask(sample.prompt),
            completion=mask(sample.completion), answer=mask(sample.answer), info=mask(sample.info),
            reward=sample.reward, functions=sample.functions, prompt_tokens=sample.prompt_tokens,
            completion_tokens=sample.completion_tokens, latency_s=sample.latency_s, truncated=sample.truncated,
            timed_out=sample.timed_out, error=mask(sample.error),
        ))
    EvaluationSample.objects.bulk_create(rows, batch_size=500)
    return {"accepted": len(rows), "duplicates": len(batch.samples) - len(rows)}


def _json_masker(mask):
    """Return ``mask`` (text → text) applied to every string inside a JSON value."""

    def apply(value):
        if isinstance(value, str):
            return mask(value)
        if isinstance(value, list):
            return [apply(item) for item in value]
        if isinstance(value, dict):
            return {key: apply(item) for key, item in value.items()}
        return value

    return apply


@transaction.atomic
def ingest_logs(*, attempt: JobAttempt, batch: LogsBatch, live: bool = True) -> dict[str, int]:
    """Store the engine's log lines; a resent line (same seq) is stored once. Lines never move a
    starting job to running (``_locked``), live or not."""
    job, attempt = _locked(attempt, batch.attempt, live=False)
    lines = [(line.seq, line.time, line.stream, line.line) for line in batch.lines]
    accepted = store_log_lines(job=job, attempt_number=attempt.number, source=LogSource.ENGINE, lines=lines)
    return {"accepted": accepted, "duplicates": len(lines) - accepted}


def _check_registration(job: Job, step: int, what: str) -> None:
    """Refuse registering an upload (``what``: checkpoint or adapter) for a job that has ended
    (409 ``invalid_state``: the hour of grace is for late reports, and a new archive would become
    the job's latest after the fact) or for a step the job cannot have (``_check_steps``)."""
    if job.status in TERMINAL_STATUSES:
        raise LabError("invalid_state", f"This job has ended ({job.status}): it takes no new {what}s.")
    _check_steps(job, {step}, what)


@transaction.atomic
def artifact_register(
    kind: ArtifactKind, *, attempt: JobAttempt, report: ArtifactRegister, live: bool = True
) -> tuple[Artifact, dict[str, Any]]:
    """Create the row of a checkpoint or adapter (``kind``) for the upload and return it with its
    upload target (``jobs.artifacts.lifecycle.register``).

    Raises LabError ``invalid_request`` for another attempt than the token's, 409 ``stale_attempt`` for a
    superseded one, 409 ``invalid_state`` once the job has ended and 409 ``invalid_step`` for a
    step it cannot have (``_check_registration``)."""
    job, attempt = _locked(attempt, report.attempt, live=live)
    _check_registration(job, report.step, kind.name)
    return lifecycle.register(kind, job=job, attempt=attempt, step=report.step, format=report.format)


def artifact_complete(kind: ArtifactKind, *, attempt: JobAttempt, artifact_id: str, report: ArtifactComplete) -> Artifact:
    """Verify the stored archive and mark the checkpoint or adapter ``ready`` or ``failed``
    (``jobs.artifacts.lifecycle.complete``, which says what it raises): only the job's current
    attempt completes, and only what it registered."""
    return lifecycle.complete(
        kind, job=attempt.job, attempt_number=attempt.number, artifact_id=artifact_id,
        size_bytes=report.size_bytes, sha256=report.sha256,
    )


@transaction.atomic
def ingest_finish(*, attempt: JobAttempt, report: FinishReport) -> None:
    """Record the outcome the engine reports before it exits (its error with the job's secrets
    masked); the reconciler applies it."""
    job, attempt = _locked(attempt, report.attempt, live=False)
    attempt.outcome = report.outcome
    mask = masker(job_id=job.public_id)
    attempt.outcome_error = {key: mask(text) for key, text in report.error.model_dump().items()} if report.error else None
    attempt.save(update_fields=["outcome", "outcome_error"])
    dispatch.enqueue_reconcile(job.pk)
