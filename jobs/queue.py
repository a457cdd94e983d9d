"""The queue's rules: order, positions, and what keeps a queued job from starting.

Order (DESIGN.md / run-pipeline issue): ``priority`` first, then age. Capacity: an organization
runs at most its cap of jobs at once (``LAB_ORG_MAX_RUNNING_JOBS``, lowerable per organization);
the pool runs at most ``LAB_LOCAL_SLOTS`` CPU jobs on the local launcher, and at most the GPUs it
has of each type.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, Q, Sum

from jobs.models import ACTIVE_STATUSES, Job, JobStatus
from jobs.pool import pool_nodes
from lab.models import Organization


def organization_cap(organization: Organization) -> int:
    """Return how many jobs ``organization`` may run at once."""
    default = settings.LAB_ORG_MAX_RUNNING_JOBS
    return min(default, organization.max_running_jobs) if organization.max_running_jobs else default


def organization_running(organization: Organization) -> int:
    """Return how many of ``organization``'s jobs hold capacity (starting, running, cancelling)."""
    return Job.objects.filter(project__organization=organization, status__in=ACTIVE_STATUSES).count()


def pool_capacity(gpu_type: str) -> int:
    """Return the pool's capacity for ``gpu_type``: CPU job slots, or GPUs of that type."""
    if gpu_type == "cpu":
        return settings.LAB_LOCAL_SLOTS if any(group.gpu_type == "cpu" for group in pool_nodes()) else 0
    return sum(group.gpus * group.count for group in pool_nodes() if group.gpu_type == gpu_type)


def pool_in_use(gpu_type: str) -> int:
    """Return the capacity of ``gpu_type`` that active jobs hold (jobs for CPU, GPUs otherwise)."""
    active = Job.objects.filter(gpu_type=gpu_type, status__in=ACTIVE_STATUSES)
    if gpu_type == "cpu":
        return active.count()
    return active.aggregate(total=Sum("gpus"))["total"] or 0


def start_blocker(*, organization: Organization, gpu_type: str, gpus: int) -> str | None:
    """Return why a job with these needs cannot start now (a ``status_reason``), or None."""
    if organization_running(organization) >= organization_cap(organization):
        return "org_concurrency_limit"
    need = 1 if gpu_type == "cpu" else gpus
    if pool_in_use(gpu_type) + need > pool_capacity(gpu_type):
        return "pool_full"
    return None


def queue_positions(jobs: list[Job]) -> dict[int, int]:
    """Return the 1-based queue place of each queued job among ``jobs`` (by primary key), in one
    query whatever their number; jobs that are not queued are left out. Same rule as ``queue_position``."""
    queued = [job for job in jobs if job.status == JobStatus.QUEUED]
    if not queued:
        return {}
    counts = {
        f"ahead_{job.pk}": Count(
            "pk",
            filter=_ahead_of(priority=job.priority, queued_at=job.queued_at) & ~Q(pk=job.pk),
        )
        for job in queued
    }
    ahead = Job.objects.filter(status=JobStatus.QUEUED).aggregate(**counts)
    return {job.pk: ahead[f"ahead_{job.pk}"] + 1 for job in queued}


def _ahead_of(*, priority: int, queued_at) -> Q:
    """The queued jobs that come before one with this priority and queue time."""
    return Q(priority__gt=priority) | Q(priority=priority, queued_at__lt=queued_at)


def jobs_ahead(*, priority: int, queued_at) -> int:
    """Return how many queued jobs come before one with this priority and queue time."""
    return Job.objects.filter(status=JobStatus.QUEUED).filter(_ahead_of(priority=priority, queued_at=queued_at)).count()


def queue_position(job: Job) -> int | None:
    """Return ``job``'s 1-based place in the queue, or None when it is not queued."""
    return queue_positions([job]).get(job.pk)
