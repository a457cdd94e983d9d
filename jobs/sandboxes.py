"""The sandboxes of a job's attempts (docs/sandboxes.md "Sandboxes of a job"): the engine of an
attempt creates them through the ingest API while the attempt is its job's current, launched
one, and none outlives the attempt: the pipeline ends them when it closes the attempt
(``sandboxes.services.sandbox_end_for_attempt``) and the periodic reconcile ends any whose
attempt has ended (``sandbox_end_of_ended_attempts``). Refusals are ``lab.errors.LabError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, DateTimeField, DurationField, F, Q, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs.ingest.tokens import attempt_for_sandbox_key, sandbox_key
from jobs.models import ACTIVE_STATUSES as ACTIVE_JOB_STATUSES
from jobs.models import AttemptState, Job, JobAttempt
from lab.audit import Actor
from lab.errors import LabError
from sandboxes.grants import SandboxGrant
from sandboxes.models import ACTIVE_STATUSES, Sandbox
from sandboxes.services import sandbox_create, sandbox_delete


def _attempt_is_open(attempt_pk: int) -> bool:
    """Whether the attempt is its active job's current, launched attempt: its engine may still run."""
    return JobAttempt.objects.filter(
        pk=attempt_pk, state=AttemptState.LAUNCHED, number=F("job__attempt"), job__status__in=ACTIVE_JOB_STATUSES
    ).exists()


def sandbox_create_for_attempt(*, attempt: JobAttempt, data: Any) -> tuple[Sandbox, list[str]]:
    """Create a sandbox for the engine of ``attempt`` (its job loaded; the ingest API's
    ``POST /sandboxes``) in the job's project, as the job's creator, within the organization's
    cap; return it and the body's warnings (``sandboxes.services.sandbox_create``).

    ``invalid_state`` when the attempt is not its active job's current, launched attempt. The
    attempt is read again once the sandbox is committed: an attempt that ended meanwhile has it
    stopped here, and one that ends later finds it (``sandbox_end_for_attempt``), so none outlives it.
    """
    if not _attempt_is_open(attempt.pk):
        raise LabError("invalid_state", "This job attempt has ended; it can create no sandbox.")
    job = attempt.job
    actor = Actor(user=job.created_by, api_key=job.created_by_key)
    sandbox, warnings = sandbox_create(project=job.project, actor=actor, data=data, attempt=attempt)
    if not _attempt_is_open(attempt.pk):
        sandbox_delete(sandbox=sandbox, actor=Actor.system())
        raise LabError("invalid_state", "This job attempt has ended; it can create no sandbox.")
    return sandbox, warnings


def sandbox_key_for_attempt(*, attempt: JobAttempt) -> str:
    """Return the sandbox key of ``attempt`` for its environments (``PRIME_API_KEY``);
    ``invalid_state`` when the attempt is not its active job's current, launched attempt."""
    if not _attempt_is_open(attempt.pk):
        raise LabError("invalid_state", "This job attempt has ended; it can create no sandbox.")
    return sandbox_key(attempt)


def sandbox_grant_for_key(key: str) -> SandboxGrant | None:
    """Return the grant of an attempt's sandbox ``key`` while the attempt may make sandboxes, else
    None (a forged key, another kind of key, or an attempt that has ended)."""
    attempt = attempt_for_sandbox_key(key)
    if attempt is None or not _attempt_is_open(attempt.pk):
        return None
    job = attempt.job
    return SandboxGrant(
        project=job.project, actor=Actor(user=job.created_by, api_key=job.created_by_key), attempt_id=attempt.pk,
        create=lambda data: sandbox_create_for_attempt(attempt=attempt, data=data),
    )


def sandbox_end_of_ended_attempts() -> int:
    """Delete every active sandbox whose attempt has ended (the job reconciler's net under
    ``sandbox_end_for_attempt``); return how many."""
    active = Sandbox.objects.unscoped().filter(status__in=ACTIVE_STATUSES, attempt__state=AttemptState.ENDED)
    ended = 0
    for sandbox in active.select_related("project__organization").order_by("pk"):
        sandbox_delete(sandbox=sandbox, actor=Actor.system())
        ended += 1
    return ended


@dataclass(frozen=True)
class JobSandboxUse:
    """The sandboxes a job's attempts made: how many, how many are still active (pending or
    running), and their seconds from start to stop (to now for those still running)."""

    made: int
    active: int
    seconds: float


def job_sandbox_use(job: Job) -> JobSandboxUse:
    """Return what sandboxes ``job``'s attempts made (one query; the job page shows it)."""
    now = Value(timezone.now(), output_field=DateTimeField())
    totals = Sandbox.objects.unscoped().filter(attempt__job=job).aggregate(
        made=Count("pk"),
        active=Count("pk", filter=Q(status__in=ACTIVE_STATUSES)),
        ran=Sum(Coalesce("stopped_at", now) - F("started_at"), output_field=DurationField(), filter=Q(started_at__isnull=False)),
    )
    return JobSandboxUse(made=totals["made"], active=totals["active"], seconds=totals["ran"].total_seconds() if totals["ran"] else 0.0)


#: The metric names of a job's sandbox use (docs/api.md "Metric names"), what ``job_sandbox_use`` counts.
SANDBOX_METRICS = ("sandboxes/made", "sandboxes/active", "sandboxes/seconds")


def job_sandbox_metrics(job: Job) -> dict[str, float]:
    """Return ``job_sandbox_use`` as metric values, or none when the job's attempts made no sandbox."""
    use = job_sandbox_use(job)
    if not use.made:
        return {}
    return dict(zip(SANDBOX_METRICS, (float(use.made), float(use.active), round(use.seconds, 3)), strict=True))
