"""Which attempts wait parked in Kueue after a preemption: the reads admission, the queue places
and the reconciler share (docs/kubernetes.md "Preemption and the queue place").

An ended attempt whose handle says ``parked`` left its JobSet suspended in Kueue at its place, for
its job's next attempt (``jobs.readmission`` opens that one when Kueue readmits the JobSet).
Below both the queue and readmission: it reads the models only.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import F, QuerySet

from jobs.models import AttemptState, JobAttempt, JobStatus, StatusReason

#: Handle key: the JobSet of this ended attempt waits in Kueue for the next one.
PARKED = "parked"


def parked(queryset: QuerySet[JobAttempt]) -> QuerySet[JobAttempt]:
    """Narrow ``queryset`` to the ended current attempts of queued jobs (requeued after a
    preemption) whose JobSet is parked."""
    return queryset.filter(
        number=F("job__attempt"),
        state=AttemptState.ENDED,
        job__status=JobStatus.QUEUED,
        job__status_reason=StatusReason.REQUEUED_AFTER_PREEMPTION,
        handle__parked=True,
    )


def awaiting_readmission(job_ids: Iterable[int]) -> set[int]:
    """Return those of ``job_ids`` that are queued with their JobSet parked in Kueue (one query):
    Kueue, not Lab's admission, starts them again."""
    job_ids = list(job_ids)
    if not job_ids:
        return set()
    return set(parked(JobAttempt.objects.filter(job_id__in=job_ids)).values_list("job_id", flat=True))


def parked_attempts() -> list[JobAttempt]:
    """Return the ended attempts whose JobSet waits in Kueue for its job's next attempt, with their job."""
    return list(parked(JobAttempt.objects.all()).select_related("job"))
