"""The usage ledger: close an attempt's intervals of compute, price and charge each once.

An attempt's compute is cut into intervals of ``LAB_USAGE_INTERVAL_S`` seconds from the moment
the launcher says it started: a running attempt's intervals close as each one ends, and the last,
shorter one closes at the attempt's end. Each interval is priced at the price in force at its end
(``billing.pricing.PriceHistory``), stored once under the unique key (attempt, index), and, for
a prepaid organization with billing on, drawn from the balance in the same transaction. Every
closing takes the organization's billing account row lock first, so two reconcilers (or two
workers) closing the same attempt at once serialize, and the second finds the intervals closed.

``usage_close_many`` closes a whole reconciler pass at once: one read of the ledger and of the
accounts for every attempt, then, when something is due, one transaction (the account locks of
the organizations concerned, in organization order; the ledger read again; one bulk insert; one
balance update). ``usage_close`` is the same for one attempt.

The same closing meters what else holds resources while it runs (``billing.models.Meter``): a
sandbox's cores and memory (two series, ``sandbox_cpu`` and ``sandbox_memory``, each at its own
price) and a dedicated inference server's GPUs (``server``). Each is an ``AttemptUsage`` with its
``meter``, the metered row's id as ``attempt_id`` and its ``units`` (cores, GB, GPUs); the key
is (meter, id, index).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Q, Subquery, Sum
from django.utils import timezone

from billing.accounts import (
    account_for,
    billing_enabled,
    charge,
    locked_accounts,
    spent_this_month_by_organization,
    used_up_bound,
)
from billing.metering import enqueue_meter_events
from billing.models import BillingAccount, Meter, Plan, UsageInterval
from billing.pricing import PriceHistory, exact_cost_micro_usd, price_history, round_micro
from lab.lib.resources import CPU, resource_units


@dataclass(frozen=True)
class AttemptUsage:
    """One attempt (or another metered thing, ``meter``) as the launcher or runtime measured it:
    whose it is, what it holds, when it ran.

    ``attempt_id`` is the attempt's row id (the ledger's key with ``meter`` and the interval
    index; a sandbox's or a server's row id for those meters); ``started_at``/``ended_at`` are
    the launcher's times (UTC; ``ended_at`` None while running). A later ``started_at`` than the
    newest interval's end (a server started again) starts the next interval there, so the time in
    between is not billed. ``units`` (cores, GB or GPUs; Decimal) replaces what ``gpus`` and
    ``resource_type`` hold (``resource_units``) when given. ``sandbox_public_id`` and
    ``deployment_public_id`` name the sandbox or deployment metered, for the ledger's rows.
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
    meter: str = Meter.ATTEMPT
    units: Decimal | None = None
    sandbox_public_id: str = ""
    deployment_public_id: str = ""

    @property
    def key(self) -> tuple[str, int]:
        """The ledger's key of this series of intervals: (meter, metered row id)."""
        return (self.meter, self.attempt_id)


@dataclass
class CloseResult:
    """What one closing did: the intervals it recorded, and whether nothing is left to spend
    (billing on and the balance or the monthly limit used up: the attempt should stop), with
    the ``billing.accounts.Blocker`` code of the bound used up (``used_up_bound``; None while
    something is left)."""

    closed: list[UsageInterval] = field(default_factory=list)
    used_up: str | None = None

    @property
    def exhausted(self) -> bool:
        """Whether nothing is left to spend (a bound is used up)."""
        return self.used_up is not None


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


def next_closings(started_at: Mapping[int, datetime], *, meter: str = Meter.ATTEMPT) -> dict[int, datetime]:
    """Return, for each attempt id of ``started_at`` (its launcher start time, UTC; the row ids of
    another ``meter``), when its next interval ends: the last recorded interval's end (else the
    start; the later of the two) plus one interval. One query for all of them; an attempt due at
    or before now has an interval to close."""
    lasts = _last_intervals((meter, attempt_id) for attempt_id in started_at)
    length = interval_seconds()
    return {
        attempt_id: (max(lasts[meter, attempt_id].ended_at, start) if (meter, attempt_id) in lasts else start) + length
        for attempt_id, start in started_at.items()
    }


def organizations_exhausted(organization_ids: Iterable[int]) -> set[int]:
    """Return those of ``organization_ids`` with nothing left to spend (billing on; the same
    bound ``usage_close`` reports as ``exhausted``); empty when billing is off."""
    if not billing_enabled():
        return set()
    return set(_exhausted(BillingAccount.objects.filter(organization_id__in=set(organization_ids)), now=timezone.now()))


@dataclass(frozen=True)
class _Last:
    """The newest recorded interval of an attempt: where the next one starts."""

    index: int
    ended_at: datetime
    running_cost_micro_usd: Decimal


#: The newest interval of each (meter, id) of two arrays, one index probe each (the unique
#: (meter, attempt_id, index) index read backwards), however long the ledger: the ORM cannot drive
#: a query from a list of values, and a grouped MAX reads every interval of every attempt.
_LAST_INTERVALS_SQL = """
SELECT newest.meter, newest.attempt_id, newest."index", newest.ended_at, newest.running_cost_micro_usd
FROM unnest(%s::varchar[], %s::bigint[]) AS metered(meter, id)
CROSS JOIN LATERAL (
    SELECT meter, attempt_id, "index", ended_at, running_cost_micro_usd FROM {table}
    WHERE meter = metered.meter AND attempt_id = metered.id ORDER BY "index" DESC LIMIT 1
) AS newest
"""


def _last_intervals(keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], _Last]:
    """Return the newest recorded interval of each (meter, metered row id) of ``keys`` that has
    one (one query)."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                _LAST_INTERVALS_SQL.format(table=connection.ops.quote_name(UsageInterval._meta.db_table)),
                [[meter for meter, _ in wanted], [attempt_id for _, attempt_id in wanted]],
            )
            rows = cursor.fetchall()
    else:  # SQLite (local development): a correlated subquery per interval, fine at its sizes
        newest = (
            UsageInterval.objects.unscoped().filter(meter=OuterRef("meter"), attempt_id=OuterRef("attempt_id"))
            .order_by("-index").values("index")[:1]
        )
        rows = [
            row for row in UsageInterval.objects.unscoped()
            .filter(attempt_id__in={attempt_id for _, attempt_id in wanted}, index=Subquery(newest))
            .values_list("meter", "attempt_id", "index", "ended_at", "running_cost_micro_usd")
            if (row[0], row[1]) in set(wanted)
        ]
    return {(meter, attempt_id): _Last(index, ended_at, Decimal(running)) for meter, attempt_id, index, ended_at, running in rows}


def _bounds_due(usage: AttemptUsage, last: _Last | None, *, now: datetime) -> list[tuple[datetime, datetime]]:
    """Return the (start, end) of each of the attempt's intervals due at ``now`` after ``last``
    (from the later of ``last``'s end and the attempt's start)."""
    until = usage.ended_at if usage.ended_at is not None else now
    start = max(last.ended_at, usage.started_at) if last is not None else usage.started_at
    return _due_bounds(start, until=until, ended=usage.ended_at is not None)


def _amounts(usage: AttemptUsage, units: Decimal, seconds: Decimal) -> dict[str, Decimal]:
    """Return what one interval of ``seconds`` holds, by the ledger's column: GPU-seconds of a GPU
    job or a dedicated server, CPU-seconds of a CPU job or of a sandbox's cores, GB-seconds of a
    sandbox's memory."""
    amount = seconds * units
    if usage.meter == Meter.SANDBOX_MEMORY:
        return {"gpu_seconds": Decimal(0), "cpu_seconds": Decimal(0), "memory_gb_seconds": amount}
    if usage.meter == Meter.SANDBOX_CPU or usage.resource_type == CPU:
        return {"gpu_seconds": Decimal(0), "cpu_seconds": amount, "memory_gb_seconds": Decimal(0)}
    return {"gpu_seconds": amount, "cpu_seconds": Decimal(0), "memory_gb_seconds": Decimal(0)}


def _intervals_due(
    usage: AttemptUsage, last: _Last | None, *, now: datetime, prices: PriceHistory, plan: str, enabled: bool
) -> list[UsageInterval]:
    """Return the attempt's intervals due at ``now`` after ``last``, priced, not yet charged or saved.

    Each costs the attempt's exact running total through it, rounded to the micro-dollar, less the
    running total before it rounded the same way, so the intervals add up to the exact cost
    rounded once.
    """
    index = last.index + 1 if last is not None else 0
    running = last.running_cost_micro_usd if last is not None else Decimal(0)
    units = usage.units if usage.units is not None else Decimal(resource_units(gpu_type=usage.resource_type, gpus=usage.gpus))
    rows = []
    for begin, end in _bounds_due(usage, last, now=now):
        seconds = Decimal((end - begin) // timedelta(microseconds=1)) / 1_000_000
        usd_per_hour = prices.at(usage.resource_type, end)
        previous, running = running, running + exact_cost_micro_usd(usd_per_hour=usd_per_hour, units=units, seconds=seconds)
        rows.append(
            UsageInterval(
                organization_id=usage.organization_id,
                project_id=usage.project_id,
                meter=usage.meter,
                job_public_id=usage.job_public_id,
                sandbox_public_id=usage.sandbox_public_id,
                deployment_public_id=usage.deployment_public_id,
                attempt_id=usage.attempt_id,
                attempt_number=usage.attempt_number,
                index=index,
                resource_type=usage.resource_type,
                units=units,
                started_at=begin,
                ended_at=end,
                **_amounts(usage, units, seconds),
                usd_per_hour=usd_per_hour,
                cost_micro_usd=round_micro(running) - round_micro(previous),
                running_cost_micro_usd=running,
                plan=plan,
                billing_enabled=enabled,
                closed_at=now,
            )
        )
        index += 1
    return rows


@dataclass
class BatchCloseResult:
    """What one closing of many attempts did: the intervals it recorded; the organizations of
    those attempts that have nothing left to spend (billing on: their attempts should stop), and
    in ``used_up`` the ``billing.accounts.Blocker`` code of the bound each of them used up; and,
    with ``skip_locked``, the organizations skipped because another closing held their account."""

    closed: list[UsageInterval] = field(default_factory=list)
    skipped: set[int] = field(default_factory=set)
    used_up: dict[int, str] = field(default_factory=dict)

    @property
    def exhausted(self) -> set[int]:
        """The organizations with nothing left to spend (those of ``used_up``)."""
        return set(self.used_up)


def _exhausted(accounts: Iterable[BillingAccount], *, now: datetime) -> dict[int, str]:
    """Return the organization ids of ``accounts`` with nothing left to spend, each with the
    ``Blocker`` code of the bound it used up (``used_up_bound``; this month's spend read in one
    query for those with a limit)."""
    accounts = list(accounts)
    limited = [account.organization_id for account in accounts if account.monthly_spend_limit_micro_usd is not None]
    spent = spent_this_month_by_organization(limited, now=now) if limited and billing_enabled() else {}
    exhausted = {}
    for account in accounts:
        code = used_up_bound(account, spent_this_month=spent.get(account.organization_id))
        if code is not None:
            exhausted[account.organization_id] = code
    return exhausted


def _close_due(due: list[AttemptUsage], *, now: datetime, prices: PriceHistory, skip_locked: bool) -> BatchCloseResult:
    """Close, price and charge the due intervals of ``due`` in one transaction holding their
    organizations' billing account locks (taken in organization order; with ``skip_locked``, an
    organization whose account another transaction holds is left out and reported skipped).

    The ledger is read again under the locks (a statement of its own, so it sees what committed
    while this one waited): another worker may have closed some meanwhile. One bulk insert, one
    ``F()`` update of the balances.
    """
    with transaction.atomic():
        accounts = locked_accounts((usage.organization_id for usage in due), skip_locked=skip_locked)
        skipped = {usage.organization_id for usage in due} - set(accounts)
        due = [usage for usage in due if usage.organization_id in accounts]
        lasts = _last_intervals(usage.key for usage in due)
        enabled = billing_enabled()
        rows = []
        for usage in due:
            account = accounts[usage.organization_id]
            rows += _intervals_due(usage, lasts.get(usage.key), now=now, prices=prices, plan=account.plan, enabled=enabled)
        if rows:
            drawn = charge([(accounts[row.organization_id], row.cost_micro_usd) for row in rows])
            for row, amount in zip(rows, drawn):
                row.charged_micro_usd = amount
            UsageInterval.objects.bulk_create(rows)
            if enabled and any(row.plan == Plan.INVOICED for row in rows):
                enqueue_meter_events()
        used_up = _exhausted(accounts.values(), now=now)
        return BatchCloseResult(closed=rows, skipped=skipped, used_up=used_up)


def usage_close_many(*, usages: Sequence[AttemptUsage], now: datetime, skip_locked: bool = False) -> BatchCloseResult:
    """Close and price the intervals of ``usages`` (one per attempt) that are due at ``now``, and
    charge prepaid credit, in one transaction for all of them.

    Idempotent: intervals already in the ledger are never recorded or charged again, whoever
    closes them at the same time. When nothing is due (most reconciler passes) nothing is locked:
    one read of the ledger for all the attempts and one of their accounts. With ``skip_locked``
    (a reconciler pass), an organization whose account another transaction holds is not waited
    for: its attempts stay due, for the next closing (``BatchCloseResult.skipped``). Raises
    ``ValueError`` when an attempt appears twice.
    """
    keys = [usage.key for usage in usages]
    if len(set(keys)) != len(keys):
        raise ValueError("usage_close_many takes each attempt once")
    if not usages:
        return BatchCloseResult()
    lasts = _last_intervals(keys)
    due = [usage for usage in usages if _bounds_due(usage, lasts.get(usage.key), now=now)]
    organizations = {usage.organization_id for usage in usages}
    accounts = {account.organization_id: account for account in BillingAccount.objects.filter(organization_id__in=organizations)}
    for usage in due:  # created before the transaction, so that it only locks
        if usage.organization_id not in accounts:
            accounts[usage.organization_id] = account_for(usage.organization_id)
    due_organizations = {usage.organization_id for usage in due}
    exhausted = _exhausted(
        (account for organization_id, account in accounts.items() if organization_id not in due_organizations), now=now
    )
    if not due:
        return BatchCloseResult(used_up=exhausted)
    prices = price_history({usage.resource_type for usage in due})
    result = _close_due(due, now=now, prices=prices, skip_locked=skip_locked)
    result.used_up.update(exhausted)
    return result


def usage_close(*, usage: AttemptUsage, now: datetime) -> CloseResult:
    """Close and price the attempt's intervals that are due at ``now``; charge prepaid credit
    (``usage_close_many`` of this one attempt).

    Idempotent: intervals already in the ledger are never recorded or charged again. Returns the
    new intervals and whether the organization has nothing left to spend (and which bound it
    used up). When no interval is
    due, nothing is locked: one read of the ledger and one of the account.
    """
    result = usage_close_many(usages=[usage], now=now)
    return CloseResult(closed=result.closed, used_up=result.used_up.get(usage.organization_id))


@dataclass(frozen=True)
class UsageTotals:
    """A job's usage summed from the ledger: seconds, and cost in micro-dollars."""

    gpu_seconds: Decimal
    cpu_seconds: Decimal
    cost_micro_usd: int


def job_usage_totals_many(job_public_ids: Iterable[str]) -> dict[str, UsageTotals]:
    """Return the sums of every interval (all attempts) of each of ``job_public_ids`` that has
    one, by job public id (one query): the seconds of its attempts' own compute, and the cost of
    everything billed to it (its attempts' sandboxes included)."""
    own = Q(meter=Meter.ATTEMPT)
    rows = (
        UsageInterval.objects.unscoped()
        .filter(job_public_id__in=set(job_public_ids))
        .values("job_public_id")
        .annotate(gpu=Sum("gpu_seconds", filter=own), cpu=Sum("cpu_seconds", filter=own), cost=Sum("cost_micro_usd"))
        .values_list("job_public_id", "gpu", "cpu", "cost")
    )
    return {
        job_public_id: UsageTotals(gpu_seconds=gpu or Decimal(0), cpu_seconds=cpu or Decimal(0), cost_micro_usd=int(cost or 0))
        for job_public_id, gpu, cpu, cost in rows
    }


def job_usage_totals(job_public_id: str) -> UsageTotals:
    """Return the sums of every interval of the job with ``job_public_id`` (all its attempts);
    zeros when it has none."""
    return job_usage_totals_many([job_public_id]).get(
        job_public_id, UsageTotals(gpu_seconds=Decimal(0), cpu_seconds=Decimal(0), cost_micro_usd=0)
    )


def deployment_usage_totals_many(deployment_public_ids: Iterable[str]) -> dict[str, UsageTotals]:
    """Return the sums of the intervals of the dedicated servers billed to each of
    ``deployment_public_ids`` that has one, by deployment public id (one query)."""
    rows = (
        UsageInterval.objects.unscoped()
        .filter(deployment_public_id__in=set(deployment_public_ids))
        .values("deployment_public_id")
        .annotate(gpu=Sum("gpu_seconds"), cpu=Sum("cpu_seconds"), cost=Sum("cost_micro_usd"))
        .values_list("deployment_public_id", "gpu", "cpu", "cost")
    )
    return {
        deployment: UsageTotals(gpu_seconds=gpu or Decimal(0), cpu_seconds=cpu or Decimal(0), cost_micro_usd=int(cost or 0))
        for deployment, gpu, cpu, cost in rows
    }
