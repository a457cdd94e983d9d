"""The reconciler's entry points: one job now (``reconcile_job``), or the periodic pass over
every active job (``reconcile_all``), which the Celery tasks of ``jobs.tasks`` run.

Each asks the launcher first with no row locked (``jobs.pipeline.observe``), then applies what
it said under the job's lock (``jobs.pipeline.apply``; ended attempts of a pass in batches,
``jobs.pipeline.batch``), and sends the signals it calls for after the lock is released.
Idempotent: each step checks the current state under the job's row lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from jobs.launchers import registry
from jobs.launchers.base import AttemptPhase
from jobs.models import ACTIVE_STATUSES, AttemptState, Job, JobAttempt
from jobs.pipeline.apply import apply_seen, deliver_spool_of_exited
from jobs.pipeline.batch import finish_ended
from jobs.pipeline.kueue import record_queue_places, watch_parked
from jobs.pipeline.observe import Seen, idle_jobs, launched_attempts, look
from jobs.pipeline.sweep import sweep_orphans
from jobs.pipeline.usage import close_due_usage
from jobs.pool import cluster_inventory_refresh
from jobs.sandboxes import sandbox_end_of_ended_attempts

logger = logging.getLogger(__name__)

#: Active jobs observed at once by one periodic pass (one launcher call per batch where it can).
RECONCILE_BATCH = 200


def reconcile_job(*, job_id: int, seen: Seen | None = None) -> None:
    """Bring one active job in line with what its launcher observes.

    The launcher is asked first, with no row locked (``seen`` when the caller asked already);
    then the job is locked briefly to apply what it said, and the signals it calls for are sent
    after the lock is released.
    """
    launcher = registry.get_launcher()
    if seen is None:
        seen = look(launcher, launched_attempts([job_id])).get(job_id)
    if (seen is not None and seen.observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST)
            and launcher.engine_workdir(seen.handle) is not None):  # a spool Lab can read (not on a cluster)
        attempt = JobAttempt.objects.filter(pk=seen.attempt_id, state=AttemptState.LAUNCHED).first()
        if attempt is not None:
            deliver_spool_of_exited(job_id, attempt, launcher)
    after: list[Callable[[], None]] = []
    with transaction.atomic():
        apply_seen(job_id, seen, launcher, after)
    for action in after:
        try:
            action()
        except Exception:  # a signal that fails is sent again at the next pass
            logger.exception("launcher action failed", extra={"job_pk": job_id})


def reconcile_all(*, batch_size: int = RECONCILE_BATCH) -> int:
    """Reconcile every active job, ``batch_size`` at a time (the launcher asked about a whole
    batch at once, no lock held; the batch's jobs whose attempts ended, with no spool to
    deliver, finished together by ``finish_ended``), and end orphan engine processes and the
    sandboxes of ended attempts; return how many jobs were seen."""
    launcher = registry.get_launcher()
    job_ids = list(Job.objects.unscoped().filter(status__in=ACTIVE_STATUSES).order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(job_ids), batch_size):
        batch = job_ids[start : start + batch_size]
        try:
            attempts = launched_attempts(batch)
            seen = look(launcher, attempts)
            closings = close_due_usage(attempts, seen, timezone.now())
            idle = idle_jobs(attempts, seen, closings, timezone.now())
        except Exception:
            logger.exception("observing a batch failed")
            continue
        ended = [
            job_id for job_id in batch
            if job_id in seen and seen[job_id].observation.phase in (AttemptPhase.EXITED, AttemptPhase.LOST)
            and launcher.engine_workdir(seen[job_id].handle) is None
        ]
        left = set(finish_ended(ended, seen, launcher)) if ended else set()
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
    parked = watch_parked(launcher)
    try:
        record_queue_places(launcher)
    except Exception:  # places are for show; the pass goes on without them
        logger.exception("reading the queue's places failed")
    sweep_orphans(launcher, parked)
    try:  # the net under closing an attempt, which ends its sandboxes itself
        sandbox_end_of_ended_attempts()
    except Exception:
        logger.exception("ending the sandboxes of ended attempts failed")
    return len(job_ids)
