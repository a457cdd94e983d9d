"""The queue's rules: order, positions, and what keeps a queued job from starting.

Order: ``priority`` first, then fair share across organizations, then age
(``fair_share_order``); admission, queue places and estimates all follow it. Capacity: an organization
runs at most its cap of jobs at once (``LAB_ORG_MAX_RUNNING_JOBS``, lowerable per organization);
the pool runs at most ``LAB_LOCAL_SLOTS`` CPU jobs on the local launcher, and at most the GPUs it
has of each type.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Sum

from billing.accounts import SpendBudget, SpendHold, billing_enabled
from billing.pricing import price_table, usd_to_micro
from jobs.models import ACTIVE_STATUSES, Job, JobStatus, StatusReason
from jobs.parking import awaiting_readmission
from jobs.pool import pool_nodes
from lab.lib.resources import CPU, resource_units
from lab.models import Organization


#: The capacity Lab counts with on the Kubernetes pool, where Kueue decides what fits.
KUEUE_OWNS_CAPACITY = 2**31 - 1
#: The PostgreSQL advisory lock that admission decisions take (``lock_admission``).
_ADMISSION_LOCK = 0x1AB0001


def lock_admission() -> None:
    """Take admission's lock for the rest of the transaction: one admission decision at a time
    (an admission pass, or a JobSet that Kueue readmitted opening its attempt)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADMISSION_LOCK])
    # SQLite runs IMMEDIATE transactions: the write lock is taken when the transaction begins.


def organization_cap(organization: Organization) -> int:
    """Return how many jobs ``organization`` may run at once."""
    default = settings.LAB_ORG_MAX_RUNNING_JOBS
    return min(default, organization.max_running_jobs) if organization.max_running_jobs else default


def organization_running(organization: Organization) -> int:
    """Return how many of ``organization``'s jobs hold capacity (starting, running, cancelling)."""
    return Job.objects.unscoped().filter(project__organization=organization, status__in=ACTIVE_STATUSES).count()


def pool_capacity(gpu_type: str) -> int:
    """Return the pool's capacity for ``gpu_type``: CPU job slots, or GPUs of that type.

    On the Kubernetes pool Kueue owns capacity, order and placement: Lab's admission checks only
    the organization's cap and billing (submit checked that the spec can ever fit), so there is
    no limit here.
    """
    if settings.LAB_LAUNCHER == "kubernetes":
        return KUEUE_OWNS_CAPACITY
    if gpu_type == CPU:
        return settings.LAB_LOCAL_SLOTS if any(group.gpu_type == CPU for group in pool_nodes()) else 0
    return sum(group.gpus * group.count for group in pool_nodes() if group.gpu_type == gpu_type)


def hourly_cost(*, gpu_type: str, gpus: int, prices: dict[str, Decimal]) -> Decimal:
    """Return what a job of ``gpu_type`` with ``gpus`` GPUs costs per hour at ``prices`` (USD)."""
    return prices.get(gpu_type, Decimal(0)) * resource_units(gpu_type=gpu_type, gpus=gpus)


@dataclass
class PoolUsage:
    """What active jobs hold now: jobs and USD per hour per organization, capacity units per type."""

    running_per_org: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    cost_per_org: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    used_per_type: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, *, organization_id: int, gpu_type: str, gpus: int, prices: dict[str, Decimal], jobs: int = 1) -> None:
        """Count ``jobs`` more active jobs of this organization and shape."""
        self.running_per_org[organization_id] += jobs
        self.cost_per_org[organization_id] += hourly_cost(gpu_type=gpu_type, gpus=gpus, prices=prices) * jobs
        self.used_per_type[gpu_type] += resource_units(gpu_type=gpu_type, gpus=gpus) * jobs


def pool_usage(prices: dict[str, Decimal]) -> PoolUsage:
    """Return what the active jobs (starting, running, cancelling) hold now, in one query."""
    usage = PoolUsage()
    active = (
        Job.objects.unscoped().filter(status__in=ACTIVE_STATUSES)
        .values("project__organization_id", "gpu_type", "gpus")
        .annotate(jobs=Count("id"))
    )
    for row in active:
        usage.add(
            organization_id=row["project__organization_id"], gpu_type=row["gpu_type"], gpus=row["gpus"],
            prices=prices, jobs=row["jobs"],
        )
    return usage


def pool_in_use(gpu_type: str) -> int:
    """Return the capacity of ``gpu_type`` that active jobs hold (jobs for CPU, GPUs otherwise)."""
    active = Job.objects.unscoped().filter(gpu_type=gpu_type, status__in=ACTIVE_STATUSES)
    if gpu_type == CPU:
        return active.count()
    return active.aggregate(total=Sum("gpus"))["total"] or 0


def start_blocker(*, organization: Organization, gpu_type: str, gpus: int) -> str | None:
    """Return why a job with these needs cannot start now (a ``status_reason``), or None."""
    if organization_running(organization) >= organization_cap(organization):
        return StatusReason.ORG_CONCURRENCY_LIMIT
    need = resource_units(gpu_type=gpu_type, gpus=gpus)
    if pool_in_use(gpu_type) + need > pool_capacity(gpu_type):
        return StatusReason.POOL_FULL
    return None


def spend_budget(organization_ids: Iterable[int]) -> SpendBudget:
    """Return what the organizations ``organization_ids`` may still spend on jobs not yet started
    (``billing.accounts.SpendBudget``): each of their starting, running and cancelling jobs holds
    its estimated cost not yet charged. One query for the jobs, one for their usage (none when
    billing is off). Call it under ``lock_admission`` where the answer decides a start."""
    if not billing_enabled():
        return SpendBudget()
    active = Job.objects.unscoped().filter(
        project__organization_id__in=set(organization_ids), status__in=ACTIVE_STATUSES
    ).values_list("project__organization_id", "public_id", "estimated_cost_usd")
    return SpendBudget(
        SpendHold(organization_id=organization_id, job_public_id=public_id, estimate_micro_usd=usd_to_micro(estimate))
        for organization_id, public_id, estimate in active
    )


@dataclass(frozen=True)
class QueuedJob:
    """What the queue's order needs of a queued job."""

    job_id: int
    priority: int
    organization_id: int
    gpu_type: str
    gpus: int
    status_reason: str = ""


def queued_jobs() -> list[QueuedJob]:
    """Return every queued job by priority (high first), then age."""
    rows = (
        Job.objects.unscoped().filter(status=JobStatus.QUEUED)
        .order_by("-priority", "queued_at", "id")
        .values_list("id", "priority", "project__organization_id", "gpu_type", "gpus", "status_reason")
    )
    return [QueuedJob(*row) for row in rows]


def fair_share_order(
    queued: list[QueuedJob], usage: PoolUsage, prices: dict[str, Decimal], take: Callable[[QueuedJob], bool]
) -> None:
    """Offer each of ``queued`` (already by priority, then age) to ``take`` in start order.

    Within a priority, the next job is that of the organization whose active jobs cost least per
    hour (then: that runs fewer jobs); ties go to the job that waited longest. When ``take``
    returns True the job counts as started: it adds to its organization's share in ``usage``
    (which this changes). Admission takes only what may start; queue places take every job.
    """
    band_start = 0
    while band_start < len(queued):
        band_end = band_start
        while band_end < len(queued) and queued[band_end].priority == queued[band_start].priority:
            band_end += 1
        per_org: dict[int, deque] = defaultdict(deque)
        for position in range(band_start, band_end):
            per_org[queued[position].organization_id].append((position, queued[position]))
        heap = [(usage.cost_per_org[org], usage.running_per_org[org], jobs[0][0], org) for org, jobs in per_org.items()]
        heapq.heapify(heap)
        while heap:
            *_, organization_id = heapq.heappop(heap)
            _, job = per_org[organization_id].popleft()
            if take(job):
                usage.add(organization_id=organization_id, gpu_type=job.gpu_type, gpus=job.gpus, prices=prices)
            if per_org[organization_id]:
                share = (usage.cost_per_org[organization_id], usage.running_per_org[organization_id])
                heapq.heappush(heap, (*share, per_org[organization_id][0][0], organization_id))
        band_start = band_end


def _start_order(queued: list[QueuedJob]) -> list[int]:
    """Return the job ids of ``queued`` in the order admission would start them if all fit."""
    prices = price_table()
    order: list[int] = []
    fair_share_order(queued, pool_usage(prices), prices, lambda job: order.append(job.job_id) is None)
    return order


#: Where Kueue's visibility API last placed Lab's jobs (``kueue_places_record``), and how long
#: that stands without a newer reading (seconds; the reconciler's pass records one every pass).
_KUEUE_PLACES_KEY = "lab:queue:kueue-places"
KUEUE_PLACES_TTL_S = 60


def kueue_places_record(*, places: dict[str, int], pending: int) -> None:
    """Record the 1-based place in Kueue's ClusterQueue of each job waiting there (by public id)
    and how many workloads wait there in all, as the visibility API said (the reconciler's pass:
    one call per pass); ``queue_positions`` reads it."""
    cache.set(_KUEUE_PLACES_KEY, {"places": places, "pending": pending}, KUEUE_PLACES_TTL_S)


def kueue_places_forget() -> None:
    """Forget Kueue's places (the visibility API is not served): Lab's own estimate stands."""
    cache.delete(_KUEUE_PLACES_KEY)


def queue_positions(jobs: list[Job]) -> dict[int, int]:
    """Return the 1-based queue place of each queued job among ``jobs`` (by primary key): its
    place in admission's start order (priority, fair share, age). A constant number of queries
    whatever the page; jobs that are not waiting are left out.

    On the Kubernetes pool, while Kueue's visibility API is read (``kueue_places_record``), a job
    waiting in Kueue (its JobSet launched, or parked after a preemption; ``starting`` or
    ``queued``) has Kueue's place, and a job Lab has not launched yet comes after everything
    waiting in Kueue, in Lab's order."""
    kueue = cache.get(_KUEUE_PLACES_KEY) if settings.LAB_LAUNCHER == "kubernetes" else None
    positions: dict[int, int] = {}
    if kueue is not None:
        waiting_statuses = (JobStatus.QUEUED, JobStatus.STARTING)  # a place read before the job started or ended is stale
        positions = {job.pk: kueue["places"][job.public_id] for job in jobs
                     if job.status in waiting_statuses and job.public_id in kueue["places"]}
    page = {job.pk for job in jobs if job.status == JobStatus.QUEUED and job.pk not in positions}
    if not page:
        return positions
    queued = queued_jobs()
    offset = 0
    if kueue is not None:
        waiting = awaiting_readmission(job.job_id for job in queued)
        queued = [job for job in queued if job.job_id not in waiting]
        offset = kueue["pending"]
    positions.update({job_id: offset + place for place, job_id in enumerate(_start_order(queued), start=1)
                      if job_id in page})
    return positions


def queue_position(job: Job) -> int | None:
    """Return ``job``'s 1-based place in the queue, or None when it is not queued."""
    return queue_positions([job]).get(job.pk)


def place_of_new_job(*, organization_id: int, priority: int, gpu_type: str, gpus: int) -> int:
    """Return the queue place a job submitted now would take (it is the youngest of its priority)."""
    queued = queued_jobs()
    newcomer = QueuedJob(job_id=0, priority=priority, organization_id=organization_id, gpu_type=gpu_type, gpus=gpus)
    at = next((index for index, job in enumerate(queued) if job.priority < priority), len(queued))
    return _start_order([*queued[:at], newcomer, *queued[at:]]).index(0) + 1
