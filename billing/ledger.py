"""The usage ledger: close an attempt's intervals of compute, price and charge each once.

An attempt's compute is cut into intervals of ``LAB_USAGE_INTERVAL_S`` seconds from the moment
the launcher says it started: a running attempt's intervals close as each one ends, and the last,
shorter one closes at the attempt's end. Each interval is priced at the price in force at its end
(``billing.pricing.price_at``), stored once under the unique key (attempt, index), and, for a
prepaid organization with billing on, drawn from the balance in the same transaction. Every
closing takes the organization's billing account row lock first, so two reconcilers (or two
workers) closing the same attempt at once serialize, and the second finds the intervals closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Sum

from billing.accounts import (
    billing_enabled,
    charge,
    left_to_spend_micro_usd,
    locked_account,
    spent_this_month_micro_usd,
)
from billing.metering import enqueue_meter_events
from billing.models import BillingAccount, Plan, UsageInterval
from billing.pricing import exact_cost_micro_usd, price_at, round_micro
from lab.lib.resources import CPU, resource_units


@dataclass(frozen=True)
class AttemptUsage:
    """One attempt as the launcher measured it: whose it is, what it holds, when it ran.

    ``attempt_id`` is the attempt's row id (the ledger's key with the interval index);
    ``started_at``/``ended_at`` are the launcher's times (UTC; ``ended_at`` None while running).
    """

    organization_id: int
    project_id: int
    job_public_id: str
    attempt_id: int
    attempt_number: int
    resource_type: str
    gpus: int
    started_at: datetime
    ended_at: datetime | None = None


@dataclass
class CloseResult:
    """What one closing did: the intervals it recorded, and whether nothing is left to spend
    (billing on and the balance or the monthly limit used up: the attempt should stop)."""

    closed: list[UsageInterval] = field(default_factory=list)
    exhausted: bool = False


def interval_seconds() -> timedelta:
    """Return the ledger's interval length (``LAB_USAGE_INTERVAL_S``)."""
    return timedelta(seconds=settings.LAB_USAGE_INTERVAL_S)


def _due_bounds(start: datetime, *, until: datetime, ended: bool) -> list[tuple[datetime, datetime]]:
    """Return the (start, end) of each interval due from ``start``: whole intervals ending by
    ``until``, and, when the attempt ``ended`` at ``until``, the shorter last one."""
    length = interval_seconds()
    bounds = []
    while start + length <= until:
        bounds.append((start, start + length))
        start += length
    if ended and start < until:
        bounds.append((start, until))
    return bounds


def _last_interval(attempt_id: int) -> UsageInterval | None:
    return UsageInterval.objects.unscoped().filter(attempt_id=attempt_id).order_by("-index").first()


def next_closings(started_at: Mapping[int, datetime]) -> dict[int, datetime]:
    """Return, for each attempt id of ``started_at`` (its launcher start time, UTC), when its
    next interval ends: the last recorded interval's end (else the start) plus one interval.
    One query for all of them; an attempt due at or before now has an interval to close."""
    ends = dict(
        UsageInterval.objects.unscoped().filter(attempt_id__in=list(started_at))
        .values("attempt_id").annotate(last_end=Max("ended_at")).values_list("attempt_id", "last_end")
    )
    return {attempt_id: ends.get(attempt_id, start) + interval_seconds() for attempt_id, start in started_at.items()}


def organizations_exhausted(organization_ids: Iterable[int]) -> set[int]:
    """Return those of ``organization_ids`` with nothing left to spend (billing on; the same
    bound ``usage_close`` reports as ``exhausted``); empty when billing is off."""
    if not billing_enabled():
        return set()
    accounts = BillingAccount.objects.filter(organization_id__in=set(organization_ids))
    exhausted = set()
    for account in accounts:
        left = left_to_spend_micro_usd(account)
        if left is not None and left <= 0:
            exhausted.add(account.organization_id)
    return exhausted


def usage_close(*, usage: AttemptUsage, now: datetime) -> CloseResult:
    """Close and price the attempt's intervals that are due at ``now``; charge prepaid credit.

    Idempotent: intervals already in the ledger are never recorded or charged again. Returns the
    new intervals and whether the organization has nothing left to spend. When no interval is
    due (most reconciler passes), nothing is locked: one read of the ledger and one of the account.
    """
    until = usage.ended_at if usage.ended_at is not None else now
    last = _last_interval(usage.attempt_id)
    start = last.ended_at if last is not None else usage.started_at
    if not _due_bounds(start, until=until, ended=usage.ended_at is not None):
        account = BillingAccount.objects.filter(organization_id=usage.organization_id).first()
        left = left_to_spend_micro_usd(account) if account is not None else None
        return CloseResult(closed=[], exhausted=left is not None and left <= 0)
    with transaction.atomic():
        account = locked_account(usage.organization_id)
        # Read again under the lock (a statement of its own, so it sees what committed while this
        # one waited): another worker may have closed some meanwhile.
        last = _last_interval(usage.attempt_id)
        start = last.ended_at if last is not None else usage.started_at
        index = last.index + 1 if last is not None else 0
        running = last.running_cost_micro_usd if last is not None else Decimal(0)
        units = resource_units(gpu_type=usage.resource_type, gpus=usage.gpus)
        closed = []
        for begin, end in _due_bounds(start, until=until, ended=usage.ended_at is not None):
            seconds = Decimal((end - begin) // timedelta(microseconds=1)) / 1_000_000
            usd_per_hour = price_at(usage.resource_type, end)
            previous, running = running, running + exact_cost_micro_usd(usd_per_hour=usd_per_hour, units=units, seconds=seconds)
            cost = round_micro(running) - round_micro(previous)
            closed.append(
                UsageInterval(
                    organization_id=usage.organization_id,
                    project_id=usage.project_id,
                    job_public_id=usage.job_public_id,
                    attempt_id=usage.attempt_id,
                    attempt_number=usage.attempt_number,
                    index=index,
                    resource_type=usage.resource_type,
                    units=units,
                    started_at=begin,
                    ended_at=end,
                    gpu_seconds=0 if usage.resource_type == CPU else seconds * units,
                    cpu_seconds=seconds * units if usage.resource_type == CPU else 0,
                    usd_per_hour=usd_per_hour,
                    cost_micro_usd=cost,
                    running_cost_micro_usd=running,
                    charged_micro_usd=charge(account, cost),
                    plan=account.plan,
                    billing_enabled=billing_enabled(),
                    closed_at=now,
                )
            )
            index += 1
        if closed:
            UsageInterval.objects.bulk_create(closed)
            if account.plan == Plan.INVOICED and billing_enabled():
                enqueue_meter_events()
        spent = spent_this_month_micro_usd(usage.organization_id, now=now) if account.monthly_spend_limit_micro_usd is not None else None
        left = left_to_spend_micro_usd(account, spent_this_month=spent)
        return CloseResult(closed=closed, exhausted=left is not None and left <= 0)


@dataclass(frozen=True)
class UsageTotals:
    """A job's usage summed from the ledger: seconds, and cost in micro-dollars."""

    gpu_seconds: Decimal
    cpu_seconds: Decimal
    cost_micro_usd: int


def job_usage_totals(job_public_id: str) -> UsageTotals:
    """Return the sums of every interval of the job with ``job_public_id`` (all its attempts)."""
    sums = (
        UsageInterval.objects.unscoped()
        .filter(job_public_id=job_public_id)
        .aggregate(gpu=Sum("gpu_seconds"), cpu=Sum("cpu_seconds"), cost=Sum("cost_micro_usd"))
    )
    return UsageTotals(
        gpu_seconds=sums["gpu"] or Decimal(0), cpu_seconds=sums["cpu"] or Decimal(0), cost_micro_usd=int(sums["cost"] or 0)
    )

