"""Kueue (the Kubernetes pool): why a launched attempt waits, JobSets parked after a preemption,
and the places Kueue gives the jobs waiting in it (docs/kubernetes.md).
"""

from __future__ import annotations

import logging

from django.db.models import F

from jobs import dispatch
from jobs.launchers.base import AttemptPhase, Launcher, LauncherUnavailable, Observation
from jobs.models import AttemptState, Job, JobAttempt, JobStatus, StatusReason
from jobs.parking import PARKED, parked_attempts
from jobs.queue import kueue_places_forget, kueue_places_record
from jobs.readmission import attempt_unpark

logger = logging.getLogger(__name__)
S = JobStatus

#: Why a launched attempt waits that a starting job shows as its ``status_reason`` (Kueue's word).
WAITING_REASONS = frozenset({StatusReason.KUEUE_PENDING, StatusReason.KUEUE_INADMISSIBLE})


def park(attempt: JobAttempt, launcher: Launcher) -> None:
    """Keep the JobSet of ``attempt``, which Kueue requeued at its place after a preemption, for
    the job's next attempt: its pod opens that one when Kueue readmits it (``jobs.readmission``),
    and admission leaves the job be (``jobs.parking``)."""
    attempt.handle = {**launcher.handle_for_readmission(attempt.handle), PARKED: True}
    attempt.save(update_fields=["handle"])


def show_waiting_reason(job: Job, observation: Observation) -> None:
    """Set a starting job's ``status_reason`` to why its launched attempt waits, in the words the
    launcher read from the cluster (``kueue_pending``, ``kueue_inadmissible``: the Workload's
    ``QuotaReserved=False`` condition; docs/api.md "Statuses"), or clear it once it waits for
    nothing of the kind; one UPDATE only when it changes."""
    reason = observation.reason if observation.reason in WAITING_REASONS else ""
    if reason != job.status_reason:
        Job.objects.unscoped().filter(pk=job.pk, status=S.STARTING).update(status_reason=reason)
        job.status_reason = reason


def watch_parked(launcher) -> list[dict]:
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


def record_queue_places(launcher) -> None:
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
