"""Admission: which queued jobs start now. One pass looks at the whole queue in order.

Order: ``priority`` (high first); then fair share across organizations: the organization whose
running jobs cost less per hour right now goes first (then the one running fewer jobs), and each job admitted in this pass adds to
its organization's share; then age (``queued_at``). A job starts when its organization is under
its cap, billing allows it (``billing_allows``, allow-all until billing lands) and the pool has
room; otherwise its ``status_reason`` says why. A job is claimed with a conditional UPDATE (queued
→ starting), so two workers never launch it twice; passes are serialized by a database lock so
they never overcommit capacity.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import Count, Sum

from billing.pricing import price_table
from jobs.metrics import record_admission_pass
from jobs.models import ACTIVE_STATUSES, Job, JobStatus
from jobs.queue import organization_cap, pool_capacity
from jobs.services import job_claim_for_start
from lab.models import Organization

#: The advisory lock key that serializes admission passes on PostgreSQL.
_ADMISSION_LOCK = 0x1AB0001


@dataclass
class AdmissionResult:
    """What one pass did: the jobs it started, how many it looked at, how long it took (ms)."""

    started: list[int] = field(default_factory=list)
    considered: int = 0
    elapsed_ms: float = 0.0


def billing_allows(organization_id: int) -> str | None:
    """Return a ``status_reason`` when billing forbids starting a job of this organization.

    Allow-all until billing is wired in; the billing issue fills this hook.
    """
    return None


def _hourly_cost(gpu_type: str, gpus: int, prices: dict[str, Decimal]) -> Decimal:
    units = Decimal(1) if gpu_type == "cpu" else Decimal(gpus)
    return prices.get(gpu_type, Decimal(0)) * units


def _lock_admission() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADMISSION_LOCK])
    # SQLite runs IMMEDIATE transactions: the write lock is taken when the transaction begins.


def _priority_bands(queued: list[tuple]) -> list[list[tuple]]:
    """Split rows already ordered by (-priority, age) into one list per priority."""
    bands: list[list[tuple]] = []
    for row in queued:
        if not bands or bands[-1][0][1] != row[1]:
            bands.append([])
        bands[-1].append(row)
    return bands


@transaction.atomic
def admission_pass() -> AdmissionResult:
    """Start every queued job that may start now, in queue order; refresh the others' reasons."""
    started_at = time.perf_counter()
    _lock_admission()
    result = AdmissionResult()
    prices = price_table()

    running_per_org: dict[int, int] = defaultdict(int)
    cost_per_org: dict[int, Decimal] = defaultdict(Decimal)
    used_per_type: dict[str, int] = defaultdict(int)
    active = (
        Job.objects.filter(status__in=ACTIVE_STATUSES)
        .values("project__organization_id", "gpu_type", "gpus")
        .annotate(jobs=Count("id"), total_gpus=Sum("gpus"))
    )
    for row in active:
        organization_id = row["project__organization_id"]
        running_per_org[organization_id] += row["jobs"]
        cost_per_org[organization_id] += _hourly_cost(row["gpu_type"], row["gpus"], prices) * row["jobs"]
        used_per_type[row["gpu_type"]] += row["jobs"] if row["gpu_type"] == "cpu" else row["total_gpus"] or 0

    queued = list(
        Job.objects.filter(status=JobStatus.QUEUED)
        .order_by("-priority", "queued_at", "id")
        .values_list("id", "priority", "project__organization_id", "gpu_type", "gpus", "status_reason")
    )
    result.considered = len(queued)
    if not queued:
        result.elapsed_ms = (time.perf_counter() - started_at) * 1000
        return result
    organizations = {org.pk: org for org in Organization.objects.filter(pk__in={row[2] for row in queued})}
    caps = {pk: organization_cap(org) for pk, org in organizations.items()}
    capacity: dict[str, int] = {}

    reasons: dict[int, str] = {}
    for band in _priority_bands(queued):
        # Fair share: take the next job of the organization whose running jobs cost least per
        # hour (then: that runs fewer jobs); ties go to the one whose next job waited longest.
        per_org: dict[int, deque] = defaultdict(deque)
        for position, row in enumerate(band):
            per_org[row[2]].append((position, row))
        heap = [(cost_per_org[org], running_per_org[org], jobs[0][0], org) for org, jobs in per_org.items()]
        heapq.heapify(heap)
        while heap:
            *_, organization_id = heapq.heappop(heap)
            _, row = per_org[organization_id].popleft()
            job_id, _, _, gpu_type, gpus, _ = row
            need = 1 if gpu_type == "cpu" else gpus
            if gpu_type not in capacity:
                capacity[gpu_type] = pool_capacity(gpu_type)
            reason = None
            if running_per_org[organization_id] >= caps[organization_id]:
                reason = "org_concurrency_limit"
            elif blocked := billing_allows(organization_id):
                reason = blocked
            elif used_per_type[gpu_type] + need > capacity[gpu_type]:
                reason = "pool_full"
            elif job_claim_for_start(job_id=job_id) is not None:
                result.started.append(job_id)
                running_per_org[organization_id] += 1
                used_per_type[gpu_type] += need
                cost_per_org[organization_id] += _hourly_cost(gpu_type, gpus, prices)
            if reason:
                reasons[job_id] = reason
            if per_org[organization_id]:
                share = (cost_per_org[organization_id], running_per_org[organization_id])
                heapq.heappush(heap, (*share, per_org[organization_id][0][0], organization_id))

    changed = [(job_id, reason) for job_id, _, _, _, _, old in queued if (reason := reasons.get(job_id)) and reason != old]
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, reason in changed:
        by_reason[reason].append(job_id)
    for reason, job_ids in by_reason.items():
        Job.objects.filter(pk__in=job_ids, status=JobStatus.QUEUED).update(status_reason=reason)
    result.elapsed_ms = (time.perf_counter() - started_at) * 1000
    record_admission_pass(result.elapsed_ms)
    return result
