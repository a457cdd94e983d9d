"""Sandboxes on the billing ledger (docs/billing.md "Sandboxes"): each sandbox that ran is billed
for its cores (CPU-seconds, the price ``sandbox_cpu``) and its memory (GB-seconds, the price
``sandbox_memory``) from the moment its runtime started it to the earlier of its stop and the
end of its lifetime, in the ledger's intervals (``billing.ledger.usage_close_many``, two series
per sandbox, keyed by the sandbox's row id), so each interval is recorded and charged once.

CPU-seconds are the cores the sandbox was given times its wall seconds: the runtime (the agent)
limits a command's CPU time but does not report what it used. A sandbox made by a job's attempt
is billed to that job (the interval's ``job_public_id``).

``sandbox_usage_close`` closes what is due: the intervals of running sandboxes, and the last one
of each sandbox that ended (then marked ``usage_closed``). ``sandboxes.services.sandbox_bill``
(the reaper's periodic task) runs it and stops what an organization can no longer pay for; each
sandbox that stops runs it for itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Q
from django.utils import timezone

from billing.ledger import AttemptUsage, BatchCloseResult, usage_close_many
from billing.models import Meter
from sandboxes.models import Sandbox, SandboxStatus

#: The price (``billing.models.Price.resource_type``) of each of a sandbox's meters.
PRICES = {Meter.SANDBOX_CPU: "sandbox_cpu", Meter.SANDBOX_MEMORY: "sandbox_memory"}


def _ended_at(sandbox: Sandbox, *, now: datetime) -> datetime | None:
    """Return when ``sandbox`` stopped using resources: None while it runs within its lifetime,
    else the earlier of its stop and the end of its lifetime (the agent stops it then on its own,
    whether or not the reaper has marked it yet)."""
    ends_at = sandbox.created_at + timedelta(seconds=sandbox.timeout_s)
    if sandbox.status == SandboxStatus.RUNNING:
        return None if now < ends_at else max(sandbox.started_at, ends_at)
    return max(sandbox.started_at, min(sandbox.stopped_at or ends_at, ends_at))


def sandbox_usages(sandboxes: Iterable[Sandbox], *, now: datetime) -> list[AttemptUsage]:
    """Return the ledger's two series (cores, memory) at ``now`` of each of ``sandboxes`` that
    started (its ``attempt__job`` loaded, for those made by a job attempt)."""
    usages = []
    for sandbox in sandboxes:
        if sandbox.started_at is None:
            continue
        job = sandbox.attempt.job.public_id if sandbox.attempt_id else ""
        for meter, units in ((Meter.SANDBOX_CPU, sandbox.cpu_cores), (Meter.SANDBOX_MEMORY, sandbox.memory_gb)):
            usages.append(
                AttemptUsage(
                    organization_id=sandbox.organization_id,
                    project_id=sandbox.project_id,
                    job_public_id=job,
                    attempt_id=sandbox.pk,
                    attempt_number=sandbox.attempt.number if sandbox.attempt_id else 0,
                    resource_type=PRICES[meter],
                    gpus=0,
                    started_at=sandbox.started_at,
                    ended_at=_ended_at(sandbox, now=now),
                    meter=meter,
                    units=Decimal(str(units)),
                    sandbox_public_id=sandbox.public_id,
                )
            )
    return usages


def _due() -> Q:
    """The sandboxes with usage to close: those running, and those ended whose last interval is not closed."""
    return Q(started_at__isnull=False) & (
        Q(status=SandboxStatus.RUNNING)
        | Q(status__in=(SandboxStatus.STOPPED, SandboxStatus.FAILED), usage_closed=False)
    )


def sandbox_usage_close(*, sandbox_ids: Iterable[int] | None = None, now: datetime | None = None) -> BatchCloseResult:
    """Close the due usage intervals of the sandboxes (those of ``sandbox_ids``, else every one
    with usage due) in one ledger transaction; mark those that ended ``usage_closed``. Return what
    the ledger closed (``used_up``: the organizations with nothing left to spend). Idempotent: an interval already in the ledger is never recorded or charged
    again, whoever closes it at the same time."""
    now = now or timezone.now()
    due = Sandbox.objects.unscoped().filter(_due()).select_related("attempt__job").order_by("pk")
    if sandbox_ids is not None:
        due = due.filter(pk__in=list(sandbox_ids))
    sandboxes = list(due)
    if not sandboxes:
        return BatchCloseResult()
    result = usage_close_many(usages=sandbox_usages(sandboxes, now=now), now=now, skip_locked=sandbox_ids is None)
    ended = [
        sandbox.pk
        for sandbox in sandboxes
        if sandbox.status != SandboxStatus.RUNNING and sandbox.organization_id not in result.skipped
    ]
    Sandbox.objects.unscoped().filter(pk__in=ended).update(usage_closed=True)
    return result
