"""Finishing a batch of ended attempts together: one transaction, one lock query, one ledger
closing, one raw ``UPDATE`` ending the attempts, and the reads finishing needs done once for all
(``EndedFacts``), each job then applied as ``jobs.pipeline.apply`` does it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from jobs.events import events_recorded_together
from jobs.launchers.base import AttemptPhase
from jobs.models import (
    ACTIVE_STATUSES,
    Adapter,
    AdapterStatus,
    AttemptState,
    Checkpoint,
    CheckpointStatus,
    JobAttempt,
    MetricStep,
)
from jobs.pipeline.apply import EndedFacts, apply_locked
from jobs.pipeline.observe import Seen
from jobs.pipeline.usage import close_ended_usage
from jobs.serializers import latest_ready_checkpoints_read_once
from jobs.webhooks.outbox import endpoints_read_once

logger = logging.getLogger(__name__)

#: How many of a batch's jobs may fail to finish (each rolling the batch back, which is then
#: applied again without them) before the rest are left to ``reconcile_job`` one by one.
FINISH_FAILURES_PER_BATCH = 3


def read_ended_facts(locked: list[JobAttempt]) -> EndedFacts:
    """Read the ``EndedFacts`` of the locked current attempts ``locked`` (jobs loaded): one
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
    return EndedFacts(
        uploading_checkpoints=uploading(Checkpoint, CheckpointStatus.UPLOADING),
        uploading_adapters=uploading(Adapter, AdapterStatus.UPLOADING),
        stored_steps=dict(stored),
        final_status=finals,
        usage_closed=set(),
    )


class _JobNotFinished(Exception):
    """Applying one job of a batch of ended ones failed (the cause is chained)."""

    def __init__(self, job_id: int):
        super().__init__(f"job pk {job_id}")
        self.job_id = job_id


def finish_ended(job_ids: list[int], seen: dict[int, Seen], launcher) -> list[int]:
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


def _finish_together(job_ids: list[int], seen: dict[int, Seen], launcher) -> tuple[set[int], list[Callable[[], None]]]:
    """Apply what was seen of the ended jobs ``job_ids`` in one transaction: the jobs are locked
    in one query, in pk order; their usage is closed in one ledger batch, their attempts ended in
    one statement and what finishing reads is read once for all (``read_ended_facts``; for
    their events, their projects' webhook endpoints and their latest ready checkpoints); then
    each job is applied as ``apply_seen`` does it, its events stored with the others' at the end
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
        facts = read_ended_facts(locked)
        facts.usage_closed = close_ended_usage(locked, seen, now)
        facts.attempts_ended = end_attempts(locked, seen, now)
        with (
            endpoints_read_once({attempt.job.project_id for attempt in locked}),
            # A checkpoint becomes ready only under its job's lock, which this transaction holds.
            latest_ready_checkpoints_read_once([attempt.job for attempt in locked]),
            # Their events are stored together at the end, still under the jobs' locks.
            events_recorded_together(),
        ):
            for attempt in locked:
                try:
                    apply_locked(attempt.job, attempt, seen.get(attempt.job_id), launcher, after, now, facts)
                except Exception as exc:
                    raise _JobNotFinished(attempt.job_id) from exc
    return {attempt.job_id for attempt in locked}, after


def end_attempts(locked: list[JobAttempt], seen: dict[int, Seen], now) -> set[int]:
    """End, in one statement, those of the locked current attempts ``locked`` that
    ``apply_locked`` finishes (launched, and the attempt seen ending), with the state, end
    time and exit code ``finish_attempt`` gives them; return their pks."""
    # The loaded attempts stay launched: apply_locked goes by them, and finish_attempt sets these on them.
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
    # on PostgreSQL and SQLite alike, as raise_usage_totals's.
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH ending(attempt_id, code) AS (VALUES {', '.join(rows)}) "
            f"UPDATE {table} AS attempt SET state = %s, ended_at = %s, exit_code = ending.code "
            "FROM ending WHERE attempt.id = ending.attempt_id",
            [*params, AttemptState.ENDED.value, connection.ops.adapt_datetimefield_value(now)],
        )
    return ended
