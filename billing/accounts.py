"""Billing accounts: the plan, the prepaid balance, the monthly spend limit, and what may run.

Billing is on only when ``STRIPE_API_KEY`` is set (``billing_enabled``). Off, usage is still
recorded and shown, but no balance is drawn down and nothing is refused. On:

- a **prepaid** organization draws its balance down as intervals close; the balance never goes
  below ``-LAB_CREDIT_GRACE_USD`` (an interval that would take it lower is charged only down to
  that floor, the rest stays recorded as its cost);
- an **invoiced** organization is never charged credit (its usage goes to Stripe as meter events);
- either may have a monthly spend limit (calendar month, UTC).

"Nothing can run at all" (``run_blocker``): a failed payment, the monthly spend limit reached, or
a prepaid balance at or below the grace floor (docs/billing.md). Short of that, a job starts only
while what is left covers its estimate besides what the started jobs hold (``SpendBudget``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Case, F, Sum, Value, When
from django.utils import timezone

from billing.models import BillingAccount, CreditGrant, CreditKind, Plan, TokenUsage, UsageInterval
from billing.pricing import cents, micro_to_usd, usd_to_micro
from lab.models import Organization


class Blocker:
    """Why nothing of an organization can run: the API's 402 codes (docs/api.md, docs/billing.md)."""

    INSUFFICIENT_CREDIT = "insufficient_credit"
    SPEND_LIMIT_REACHED = "spend_limit_reached"
    PAYMENT_FAILED = "payment_failed"


BLOCKER_MESSAGES = {
    Blocker.INSUFFICIENT_CREDIT: "The organization's credit is used up; buy credits to run jobs.",
    Blocker.SPEND_LIMIT_REACHED: "The organization reached its monthly spend limit; raise it to run jobs.",
    Blocker.PAYMENT_FAILED: "The organization's last payment failed; update the payment method to run jobs.",
}


def billing_enabled() -> bool:
    """Return whether billing is on (``STRIPE_API_KEY`` set): credits drawn, limits enforced."""
    return bool(settings.STRIPE_API_KEY)


def grace_floor_micro_usd() -> int:
    """Return the lowest balance allowed, in micro-dollars (``-LAB_CREDIT_GRACE_USD``)."""
    return -usd_to_micro(settings.LAB_CREDIT_GRACE_USD)


def account_for(organization_id: int) -> BillingAccount:
    """Return the organization's billing account, creating it (prepaid, with the trial credit
    ``LAB_TRIAL_CREDIT_USD`` as its first grant) on first use. Safe against concurrent creation."""
    account = BillingAccount.objects.filter(organization_id=organization_id).first()
    if account is not None:
        return account
    trial = usd_to_micro(settings.LAB_TRIAL_CREDIT_USD)
    try:
        with transaction.atomic():
            account = BillingAccount.objects.create(organization_id=organization_id, balance_micro_usd=trial)
            CreditGrant.objects.create(account=account, kind=CreditKind.TRIAL, amount_micro_usd=trial, reference="trial")
    except IntegrityError:  # another request created it first
        account = BillingAccount.objects.get(organization_id=organization_id)
    return account


def locked_account(organization_id: int) -> BillingAccount:
    """Return the organization's account locked for update (call inside a transaction), creating
    it first when missing."""
    account = BillingAccount.objects.select_for_update().filter(organization_id=organization_id).first()
    if account is None:
        account_for(organization_id)
        account = BillingAccount.objects.select_for_update().get(organization_id=organization_id)
    return account


def locked_accounts(organization_ids: Iterable[int], *, skip_locked: bool = False) -> dict[int, BillingAccount]:
    """Return the accounts of ``organization_ids`` locked for update, by organization id (call
    inside a transaction; one query); without ``skip_locked``, those missing are created.

    The rows are locked in organization order, so two callers locking overlapping sets never
    deadlock (every other locker takes one account). With ``skip_locked``, an account another
    transaction holds (or is creating) is left out instead of waited for.
    """
    wanted = sorted(set(organization_ids))
    locking = BillingAccount.objects.select_for_update(skip_locked=skip_locked).order_by("organization_id")
    accounts = {account.organization_id: account for account in locking.filter(organization_id__in=wanted)}
    missing = [organization_id for organization_id in wanted if organization_id not in accounts]
    if missing and not skip_locked:  # first use (callers create accounts before their transaction; this is the fallback)
        for organization_id in missing:
            account_for(organization_id)
        accounts.update({account.organization_id: account for account in locking.filter(organization_id__in=missing)})
    return accounts


def month_start(moment: datetime) -> datetime:
    """Return the first instant (UTC) of ``moment``'s calendar month."""
    moment = moment.astimezone(dt_timezone.utc)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def spent_this_month_by_organization(organization_ids: Iterable[int], *, now: datetime | None = None) -> dict[int, int]:
    """Return, by organization id, the cost in micro-dollars of the intervals of each of
    ``organization_ids`` that ended this calendar month (UTC) and of its inference requests
    recorded this month (``TokenUsage``); 0 for one without any. Two queries."""
    wanted = set(organization_ids)
    start = month_start(now or timezone.now())
    spent: dict[int, int] = {}
    for rows in (
        UsageInterval.objects.unscoped().filter(organization_id__in=wanted, ended_at__gte=start),
        TokenUsage.objects.unscoped().filter(organization_id__in=wanted, created_at__gte=start),
    ):
        for organization_id, total in rows.values("organization_id").annotate(total=Sum("cost_micro_usd")).values_list("organization_id", "total"):
            spent[organization_id] = spent.get(organization_id, 0) + int(total or 0)
    return {organization_id: spent.get(organization_id, 0) for organization_id in wanted}


def spent_this_month_micro_usd(organization_id: int, *, now: datetime | None = None) -> int:
    """Return the cost of the organization's intervals that ended this calendar month (UTC) and of
    its inference requests of this month."""
    return spent_this_month_by_organization([organization_id], now=now)[organization_id]


def spending_bounds(account: BillingAccount, *, spent_this_month: int | None = None) -> dict[str, int]:
    """Return what each of the organization's bounds leaves it to spend, in micro-dollars (below
    0 once overrun), keyed by the ``Blocker`` code that names the bound once it is used up:
    ``spend_limit_reached`` (the monthly spend limit less this month's spend) when it has a limit,
    then ``insufficient_credit`` (the balance above the grace floor) when it is prepaid.

    Empty when billing is off, or for an invoiced organization without a limit. ``spent_this_month``
    (micro-dollars) spares the ledger read when the caller has it.
    """
    if not billing_enabled():
        return {}
    bounds = {}
    if account.monthly_spend_limit_micro_usd is not None:
        spent = spent_this_month_micro_usd(account.organization_id) if spent_this_month is None else spent_this_month
        bounds[Blocker.SPEND_LIMIT_REACHED] = account.monthly_spend_limit_micro_usd - spent
    if account.plan == Plan.PREPAID:
        bounds[Blocker.INSUFFICIENT_CREDIT] = account.balance_micro_usd - grace_floor_micro_usd()
    return bounds


def used_up_bound(account: BillingAccount, *, spent_this_month: int | None = None) -> str | None:
    """Return the ``Blocker`` code of the first of the organization's bounds with nothing left
    (``spending_bounds``' order: the spend limit before the credit), or None while both leave
    something (always None when billing is off). What a running job is stopped for."""
    for code, left in spending_bounds(account, spent_this_month=spent_this_month).items():
        if left <= 0:
            return code
    return None


def run_blocker(account: BillingAccount) -> str | None:
    """Return why nothing of this organization can run now (a ``Blocker`` code), or None.

    Always None when billing is off.
    """
    if not billing_enabled():
        return None
    if account.payment_failed:
        return Blocker.PAYMENT_FAILED
    if account.monthly_spend_limit_micro_usd is not None and (
        spent_this_month_micro_usd(account.organization_id) >= account.monthly_spend_limit_micro_usd
    ):
        return Blocker.SPEND_LIMIT_REACHED
    if account.plan == Plan.PREPAID and account.balance_micro_usd <= grace_floor_micro_usd():
        return Blocker.INSUFFICIENT_CREDIT
    return None


def organization_run_blocker(organization_id: int) -> str | None:
    """Return ``run_blocker`` of the organization's account (created on first use)."""
    if not billing_enabled():
        return None
    return run_blocker(account_for(organization_id))


def charge(costs: Sequence[tuple[BillingAccount, int]]) -> list[int]:
    """Draw each ``(account, cost_micro_usd)`` of ``costs`` in turn from its locked prepaid
    account without passing the grace floor; return what was drawn for each (0 when billing is
    off or the account is invoiced).

    An account's first costs are drawn in full until its floor is reached; the one that reaches it
    is drawn down to the floor, the rest not at all. The caller holds the accounts' row locks
    (``locked_account``, ``locked_accounts``); the balances change by one ``F()`` update for all
    of them, and each ``account`` is kept in step.
    """
    enabled = billing_enabled()
    floor = grace_floor_micro_usd()
    available: dict[int, int] = {}
    totals: dict[int, int] = {}
    drawn = []
    for account, cost in costs:
        if not enabled or account.plan != Plan.PREPAID:
            drawn.append(0)
            continue
        left = available.setdefault(account.pk, account.balance_micro_usd - floor)
        amount = max(0, min(cost, left))
        available[account.pk] = left - amount
        totals[account.pk] = totals.get(account.pk, 0) + amount
        drawn.append(amount)
    totals = {pk: total for pk, total in totals.items() if total}
    if totals:
        BillingAccount.objects.filter(pk__in=totals).update(
            balance_micro_usd=F("balance_micro_usd")
            - Case(*(When(pk=pk, then=Value(total)) for pk, total in totals.items()), output_field=BigIntegerField())
        )
        for account in {id(account): account for account, _ in costs}.values():
            account.balance_micro_usd -= totals.get(account.pk, 0)
    return drawn


@dataclass(frozen=True)
class Balance:
    """``GET /billing/balance`` (docs/billing.md): money in USD, exact."""

    plan: str
    balance_usd: Decimal
    spend_limit_usd: Decimal | None
    spent_this_month_usd: Decimal
    payment_failed: bool
    billing_enabled: bool


def balance_of(organization: Organization) -> Balance:
    """Return the organization's plan, balance, spend limit and this month's spend."""
    account = account_for(organization.pk)
    limit = account.monthly_spend_limit_micro_usd
    return Balance(
        plan=account.plan,
        balance_usd=micro_to_usd(account.balance_micro_usd),
        spend_limit_usd=None if limit is None else micro_to_usd(limit),
        spent_this_month_usd=micro_to_usd(spent_this_month_micro_usd(organization.pk)),
        payment_failed=account.payment_failed,
        billing_enabled=billing_enabled(),
    )


@transaction.atomic
def credit_add(*, organization_id: int, amount_micro_usd: int, kind: str, reference: str) -> bool:
    """Add credit to the organization's balance once per ``reference``; return whether it was added.

    A second call with the same ``reference`` (a Stripe Checkout session id) changes nothing.
    """
    account = locked_account(organization_id)
    if CreditGrant.objects.filter(account=account, reference=reference).exists():
        return False
    CreditGrant.objects.create(account=account, kind=kind, amount_micro_usd=amount_micro_usd, reference=reference)
    BillingAccount.objects.filter(pk=account.pk).update(balance_micro_usd=F("balance_micro_usd") + amount_micro_usd)
    return True


def spend_limit_stop_message(organization_id: int) -> str:
    """Return the error message of a job stopped because its organization reached its monthly
    spend limit, naming the limit as it is now (in USD, to the cent)."""
    limit = account_for(organization_id).monthly_spend_limit_micro_usd
    named = "" if limit is None else f" of ${cents(micro_to_usd(limit))}"
    return (
        f"The organization reached its monthly spend limit{named}; "
        "raise the limit (or wait for next month) and restart the job."
    )


@dataclass(frozen=True)
class SpendHold:
    """What one started job may still spend: held against its organization's balance and spend
    limit from its start until its usage is charged or it ends.

    ``estimate_micro_usd`` is the job's whole estimated cost (all attempts); what the ledger has
    recorded for ``job_public_id`` so far is taken off it (``held_by_organization``).
    """

    organization_id: int
    job_public_id: str
    estimate_micro_usd: int


def held_by_organization(holds: Iterable[SpendHold]) -> dict[int, int]:
    """Return, by organization id, what ``holds`` still hold, in micro-dollars: each job's
    estimate less the cost of its intervals in the ledger (all attempts, any month), never below
    0. One query; an organization whose holds hold nothing is 0, one without holds is left out.
    """
    holds = list(holds)
    recorded = dict(
        UsageInterval.objects.unscoped()
        .filter(job_public_id__in={hold.job_public_id for hold in holds})
        .values("job_public_id")
        .annotate(total=Sum("cost_micro_usd"))
        .values_list("job_public_id", "total")
    ) if holds else {}
    held: dict[int, int] = {}
    for hold in holds:
        remaining = max(0, hold.estimate_micro_usd - int(recorded.get(hold.job_public_id) or 0))
        held[hold.organization_id] = held.get(hold.organization_id, 0) + remaining
    return held


class SpendBudget:
    """What each organization may still spend for the jobs not yet started (billing on only).

    What an organization has left (``spending_bounds``: its balance above the grace floor, what
    its monthly spend limit leaves) less what its started jobs hold (``holds``: each one's
    estimate not yet charged, ``held_by_organization``), so a job that runs but whose usage is
    not yet charged counts as much as one started a moment ago. ``refusal`` says why a job whose
    remaining estimate is ``estimate_micro_usd`` may not start; ``commit`` holds a job started
    with this budget, so one pass never starts more than an organization can pay.

    Pass the holds of every starting, running and cancelling job of the organizations asked
    about, read under admission's lock (``jobs.queue.lock_admission``): admission decisions are
    serialized, so each sees the jobs the previous ones started. The ledger is read (here) before
    the accounts (on first use): an interval charged in between is then counted twice, held and
    spent, never not at all.
    """

    def __init__(self, holds: Iterable[SpendHold] = ()) -> None:
        self._held = held_by_organization(holds) if billing_enabled() else {}
        self._bounds: dict[int, dict[str, int]] = {}
        self._blockers: dict[int, str | None] = {}

    def _load(self, organization_id: int) -> None:
        if organization_id not in self._bounds:
            account = account_for(organization_id)
            self._blockers[organization_id] = run_blocker(account)
            held = self._held.get(organization_id, 0)
            self._bounds[organization_id] = {code: left - held for code, left in spending_bounds(account).items()}

    def refusal(self, organization_id: int, estimate_micro_usd: int) -> str | None:
        """Return a ``Blocker`` code when the job may not start, else None (always None when billing is off).

        The code names why: nothing of the organization can run (``run_blocker``), else the first
        bound (``spending_bounds``' order) that cannot take the estimate besides what is held.
        """
        if not billing_enabled():
            return None
        self._load(organization_id)
        if self._blockers[organization_id]:
            return self._blockers[organization_id]
        for code, left in self._bounds[organization_id].items():
            if left <= 0 or estimate_micro_usd > left:
                return code
        return None

    def commit(self, organization_id: int, estimate_micro_usd: int) -> None:
        """Hold a job just started with this budget: take its estimate off what its organization has left."""
        for code in self._bounds.get(organization_id, {}):
            self._bounds[organization_id][code] -= estimate_micro_usd
