"""Usage: closing attempts' usage intervals in the billing ledger, and the jobs' usage totals.

One attempt at a time under its job's lock (``record_usage``), or a whole pass's running
attempts (``close_due_usage``) and a batch's ended ones (``close_ended_usage``) in one ledger
transaction each, the jobs' totals raised in one raw ``UPDATE ... FROM VALUES``
(``raise_usage_totals``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from django.db import connection, transaction

from billing.accounts import Blocker
from billing.ledger import (
    AttemptUsage,
    interval_seconds,
    job_usage_totals,
    job_usage_totals_many,
    next_closings,
    usage_close,
    usage_close_many,
)
from billing.pricing import micro_to_usd
from jobs.launchers.base import AttemptPhase, Observation
from jobs.models import AttemptState, Job, JobAttempt, StopReason
from jobs.pipeline.observe import Launched, Seen
from jobs.services import attempt_request_stop

logger = logging.getLogger(__name__)


def record_usage(job: Job, attempt: JobAttempt, observation: Observation, now) -> None:
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


def close_due_usage(attempts: list[Launched], seen: dict[int, Seen], now) -> dict[int, datetime]:
    """Close the due usage intervals of a batch's running attempts in one ledger transaction
    (``usage_close_many``; launcher times as ``record_usage`` takes them), holding no job lock,
    and raise their jobs' usage totals to the ledger's. Return when the next interval of each
    running attempt ends, by attempt pk (``next_closings``: one read of the ledger, moved on past
    what this closing recorded), for ``idle_jobs``.

    An organization whose billing account another closing holds is skipped, not waited for: its
    jobs stay due, so the pass applies them one by one (``record_usage``), as it does attempts
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
        raise_usage_totals({interval.job_public_id for interval in result.closed})
    except Exception:
        logger.exception("closing a batch's usage intervals failed")
    return closings


def raise_usage_totals(job_public_ids: set[str]) -> dict[str, tuple[float, float, Decimal]]:
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


def close_ended_usage(locked: list[JobAttempt], seen: dict[int, Seen], now) -> set[int]:
    """Close the due usage intervals of the locked ended attempts ``locked`` in one ledger
    transaction (launcher times, as ``record_usage`` takes them) and raise their jobs' totals
    to the ledger's sums, on the loaded jobs too (they stay the rows as they are, for
    ``job_transition(current=True)``); return the pks of the attempts so handled. On a failure
    (logged) nothing is returned: each attempt's usage is then closed on its own
    (``record_usage``)."""
    usages, handled = [], set()
    for attempt in locked:
        look = seen[attempt.job_id]
        if look.attempt_id != attempt.pk or attempt.state != AttemptState.LAUNCHED:
            continue  # not the attempt that was seen ending: apply_locked leaves it alone
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
            totals = raise_usage_totals({interval.job_public_id for interval in result.closed})
    except Exception:
        logger.exception("closing the usage of a batch's ended attempts failed")
        return set()
    for attempt in locked:
        job = attempt.job
        if job.public_id in totals:
            job.gpu_seconds, job.cpu_seconds, job.cost_usd = totals[job.public_id]
    return handled
