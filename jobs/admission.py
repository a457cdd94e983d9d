"""Admission: which queued jobs start now. One pass looks at the whole queue in order.

Order (``jobs.queue.fair_share_order``, the same the queue places follow): ``priority`` (high
first); then fair share across organizations: the organization whose running jobs cost less per
hour right now goes first (then the one running fewer jobs), and each job admitted in this pass
adds to its organization's share; then age (``queued_at``). A job starts when its organization is under
its cap, billing allows it (``billing_allows``: its organization can pay its estimate besides what its
started jobs hold, ``jobs.queue.spend_budget``) and the pool has room; otherwise its ``status_reason``
says why. A job naming an environment version whose build is still queued or running waits
(``environment_building``); one whose build failed fails with the build's error
(``jobs.environment_packages.environment_build_holds``). A job is claimed with a conditional
UPDATE (queued → starting), so two workers never launch it twice; passes are serialized by a database lock (``jobs.queue.lock_admission``) so they
never overcommit capacity or credit. On the Kubernetes pool a job queued after a preemption whose JobSet
waits in Kueue at its place is Kueue's to start again (``jobs.parking``, ``jobs.readmission``), not admission's.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from billing.accounts import SpendBudget, billing_enabled
from billing.pricing import price_table, usd_to_micro
from jobs.environment_packages import environment_build_holds
from jobs.metrics import record_admission_pass
from jobs.models import ErrorCode, Job, JobStatus, StatusReason
from jobs.parking import awaiting_readmission
from jobs.queue import (
    QueuedJob,
    fair_share_order,
    lock_admission,
    organization_cap,
    pool_capacity,
    pool_usage,
    queued_jobs,
    spend_budget,
)
from jobs.services import InvalidTransition, job_claim_for_start, job_transition
from lab.lib.resources import resource_units
from lab.models import Organization


@dataclass
class AdmissionResult:
    """What one pass did: the jobs it started, how many it looked at, how long it took (ms)."""

    started: list[int] = field(default_factory=list)
    considered: int = 0
    elapsed_ms: float = 0.0


def billing_allows(organization_id: int, estimate_micro_usd: int, budget: SpendBudget) -> str | None:
    """Return ``payment_required`` when billing forbids starting a job of this organization whose
    remaining estimate (estimated cost less what it already used) is ``estimate_micro_usd``:
    nothing of the organization can run, or the estimate exceeds what it has left once its
    started jobs' uncharged estimates are held (``billing.accounts.SpendBudget``). None when
    billing is off."""
    return StatusReason.PAYMENT_REQUIRED if budget.refusal(organization_id, estimate_micro_usd) else None


def _remaining_estimates(queued: list[QueuedJob]) -> dict[int, int]:
    """Return each queued job's estimated cost not yet used, in micro-dollars (billing on only)."""
    if not billing_enabled():
        return {}
    rows = Job.objects.unscoped().filter(pk__in=[job.job_id for job in queued]).values_list("pk", "estimated_cost_usd", "cost_usd")
    return {pk: max(0, usd_to_micro(estimate - used)) for pk, estimate, used in rows}


def _fail_on_builds(messages: dict[int, str]) -> None:
    """Fail the queued jobs ``{job id: message}`` whose environment's build failed while they waited."""
    for job in Job.objects.unscoped().filter(pk__in=messages, status=JobStatus.QUEUED):
        try:
            job_transition(job=job, to=JobStatus.FAILED, error_code=ErrorCode.ENVIRONMENT_ERROR, error_message=messages[job.pk])
        except InvalidTransition:  # it left the queue meanwhile (cancelled)
            continue


@transaction.atomic
def admission_pass() -> AdmissionResult:
    """Start every queued job that may start now, in queue order; refresh the others' reasons."""
    started_at = time.perf_counter()
    lock_admission()
    result = AdmissionResult()
    queued = queued_jobs()
    if settings.LAB_LAUNCHER == "kubernetes":  # a preempted job's JobSet waits in Kueue at its place
        parked = awaiting_readmission(job.job_id for job in queued)
        queued = [job for job in queued if job.job_id not in parked]
    building, build_failed = environment_build_holds([job.job_id for job in queued])
    _fail_on_builds(build_failed)
    queued = [job for job in queued if job.job_id not in build_failed]
    result.considered = len(queued)
    if not queued:
        result.elapsed_ms = (time.perf_counter() - started_at) * 1000
        return result
    prices = price_table()
    usage = pool_usage(prices)
    organizations = {org.pk: org for org in Organization.objects.filter(pk__in={job.organization_id for job in queued})}
    caps = {pk: organization_cap(org) for pk, org in organizations.items()}
    capacity: dict[str, int] = {}
    reasons: dict[int, str] = {}
    budget = spend_budget(organizations)
    estimates = _remaining_estimates(queued)

    def take(job: QueuedJob) -> bool:
        if job.gpu_type not in capacity:
            capacity[job.gpu_type] = pool_capacity(job.gpu_type)
        need = resource_units(gpu_type=job.gpu_type, gpus=job.gpus)
        if usage.running_per_org[job.organization_id] >= caps[job.organization_id]:
            reasons[job.job_id] = StatusReason.ORG_CONCURRENCY_LIMIT
        elif blocked := billing_allows(job.organization_id, estimates.get(job.job_id, 0), budget):
            reasons[job.job_id] = blocked
        elif usage.used_per_type[job.gpu_type] + need > capacity[job.gpu_type]:
            reasons[job.job_id] = StatusReason.POOL_FULL
        elif job_claim_for_start(job_id=job.job_id) is not None:
            budget.commit(job.organization_id, estimates.get(job.job_id, 0))
            result.started.append(job.job_id)
            return True
        return False

    reasons.update(dict.fromkeys(building, StatusReason.ENVIRONMENT_BUILDING))
    fair_share_order([job for job in queued if job.job_id not in building], usage, prices, take)

    by_reason: dict[str, list[int]] = defaultdict(list)
    for job in queued:
        reason = reasons.get(job.job_id)
        if reason and reason != job.status_reason:
            by_reason[reason].append(job.job_id)
    for reason, job_ids in by_reason.items():
        Job.objects.unscoped().filter(pk__in=job_ids, status=JobStatus.QUEUED).update(status_reason=reason)
    result.elapsed_ms = (time.perf_counter() - started_at) * 1000
    record_admission_pass(result.elapsed_ms)
    return result
