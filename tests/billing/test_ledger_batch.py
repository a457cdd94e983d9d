"""Closing many attempts at once (billing.ledger.usage_close_many, what a reconciler pass does):
each interval once, priced and charged as one attempt at a time would be, in one transaction
whatever the number of attempts."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.accounts import account_for
from billing.ledger import AttemptUsage, usage_close, usage_close_many
from billing.models import BillingAccount, Plan, UsageInterval
from billing.pricing import PriceHistory, price_at, price_set
from tests.billing.conftest import T0, at

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "default_prices")]


def usage(tenant, attempt_id: int, *, resource="cpu", gpus=0, ended_at=None) -> AttemptUsage:
    """One attempt of ``tenant`` running since ``T0`` (ended at ``ended_at`` when given)."""
    return AttemptUsage(
        organization_id=tenant.organization.pk, project_id=tenant.project.pk, job_public_id=f"job_{attempt_id}",
        attempt_id=attempt_id, attempt_number=1, resource_type=resource, gpus=gpus, started_at=T0, ended_at=ended_at,
    )


def ledger(attempt_id: int) -> list[tuple[int, int, int]]:
    """Return (index, cost, charged) of each interval of the attempt, in order."""
    rows = UsageInterval.objects.unscoped().filter(attempt_id=attempt_id).order_by("index")
    return list(rows.values_list("index", "cost_micro_usd", "charged_micro_usd"))


def balance(tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro_usd


def test_a_batch_over_two_organizations_closes_and_charges_each_interval_once(owner, outsider, billing_on):
    usages = [
        usage(owner, 1),  # cpu: $0.10 per job-hour, 60 s = 1666.67 micro-dollars
        usage(owner, 2, resource="H100", gpus=2),  # 2 × $2.50 per GPU-hour, 60 s = 83333.33
        usage(outsider, 3, ended_at=at(130.5)),
    ]

    first = usage_close_many(usages=usages, now=at(150))
    again = usage_close_many(usages=usages, now=at(150))
    later = usage_close_many(usages=usages, now=at(185))

    assert sorted((row.attempt_id, row.index) for row in first.closed) == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    assert again.closed == []
    assert sorted((row.attempt_id, row.index) for row in later.closed) == [(1, 2), (2, 2)]
    assert ledger(1) == [(0, 1667, 1667), (1, 1666, 1666), (2, 1667, 1667)]
    assert ledger(2) == [(0, 83333, 83333), (1, 83334, 83334), (2, 83333, 83333)]
    assert ledger(3) == [(0, 1667, 1667), (1, 1666, 1666), (2, 292, 292)]  # 130.5 s = 3625 exactly
    assert balance(owner) == 10_000_000 - 5000 - 250_000
    assert balance(outsider) == 10_000_000 - 3625
    assert (first.exhausted, first.skipped) == (set(), set())


def test_a_batch_records_what_one_attempt_at_a_time_records(owner, billing_on):
    one_at_a_time = [usage(owner, 1, resource="H100", gpus=1), usage(owner, 2, ended_at=at(250))]
    batched = [usage(owner, 11, resource="H100", gpus=1), usage(owner, 12, ended_at=at(250))]
    for moment in (at(70), at(200), at(400)):
        for one in one_at_a_time:
            usage_close(usage=one, now=moment)
        usage_close_many(usages=batched, now=moment)

    fields = ("index", "started_at", "ended_at", "gpu_seconds", "cpu_seconds", "usd_per_hour", "cost_micro_usd", "charged_micro_usd")
    for single, batch in ((1, 11), (2, 12)):
        assert list(UsageInterval.objects.unscoped().filter(attempt_id=batch).order_by("index").values_list(*fields)) == list(
            UsageInterval.objects.unscoped().filter(attempt_id=single).order_by("index").values_list(*fields)
        )
    assert len(ledger(1)) == 6 and len(ledger(2)) == 5


def test_a_batch_takes_as_many_queries_for_twenty_attempts_as_for_two(owner, outsider, billing_on):
    def queries(count: int, first_id: int) -> list[str]:
        usages = [usage(owner if n % 2 else outsider, first_id + n) for n in range(count)]
        account_for(owner.organization.pk), account_for(outsider.organization.pk)
        with CaptureQueriesContext(connection) as captured:
            result = usage_close_many(usages=usages, now=at(130))
        assert len(result.closed) == 2 * count
        return [query["sql"] for query in captured]

    few, many = queries(2, 100), queries(20, 200)

    assert len(few) == len(many)
    assert sum("FOR UPDATE" in sql for sql in many) == 1  # both accounts, one statement
    assert sum(sql.startswith("INSERT") for sql in many) == 1
    assert sum(sql.startswith("UPDATE") for sql in many) == 1  # both balances, one statement


def test_nothing_due_locks_nothing(owner, billing_on):
    usages = [usage(owner, n) for n in range(1, 6)]
    usage_close_many(usages=usages, now=at(60))
    with CaptureQueriesContext(connection) as captured:
        result = usage_close_many(usages=usages, now=at(119))
    assert result.closed == []
    assert len(captured) == 2  # the ledger, the accounts
    assert not any("FOR UPDATE" in query["sql"] for query in captured)


def test_a_batch_that_reaches_the_grace_floor_draws_down_to_it_and_no_further(owner, billing_on):
    billing_on.LAB_CREDIT_GRACE_USD = Decimal("0.05")
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(balance_micro_usd=100_000)  # $0.10 left
    usages = [usage(owner, n, resource="H100", gpus=1) for n in (1, 2, 3, 4)]  # 60 s = $0.041667 each

    result = usage_close_many(usages=usages, now=at(60))

    assert [row.cost_micro_usd for row in result.closed] == [41667, 41667, 41667, 41667]
    assert [row.charged_micro_usd for row in result.closed] == [41667, 41667, 41667, 24999]  # down to -$0.05
    assert balance(owner) == -50_000
    assert result.exhausted == {owner.organization.pk}
    later = usage_close_many(usages=usages, now=at(120))
    assert [(row.cost_micro_usd, row.charged_micro_usd) for row in later.closed] == [(41666, 0)] * 4
    assert balance(owner) == -50_000


def test_an_invoiced_organization_is_never_charged_in_a_batch_and_its_meter_events_are_owed(owner, outsider, billing_on, monkeypatch):
    enqueued = []
    monkeypatch.setattr("billing.ledger.enqueue_meter_events", lambda: enqueued.append(True))
    account_for(outsider.organization.pk)
    BillingAccount.objects.filter(organization=outsider.organization).update(plan=Plan.INVOICED)

    result = usage_close_many(usages=[usage(owner, 1), usage(outsider, 2)], now=at(60))

    assert [(row.attempt_id, row.plan, row.charged_micro_usd) for row in sorted(result.closed, key=lambda r: r.attempt_id)] == [
        (1, Plan.PREPAID, 1667), (2, Plan.INVOICED, 0)
    ]
    assert balance(outsider) == 10_000_000
    assert enqueued == [True]
    usage_close_many(usages=[usage(owner, 1)], now=at(120))  # prepaid only: nothing owed to Stripe
    assert enqueued == [True]


def test_an_interval_in_a_batch_is_priced_at_the_price_in_force_at_its_end(owner, billing_on, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: at(90))
        price_set(resource_type="cpu", usd_per_hour=Decimal("0.40"))

    usage_close_many(usages=[usage(owner, 1)], now=at(180))

    rows = UsageInterval.objects.unscoped().filter(attempt_id=1).order_by("index")
    assert [(row.usd_per_hour, row.cost_micro_usd) for row in rows] == [
        (Decimal("0.1000"), 1667), (Decimal("0.4000"), 6666), (Decimal("0.4000"), 6667)
    ]


def test_the_price_history_answers_as_the_price_table_did(owner):
    history = PriceHistory(
        {"H100": [(at(100), Decimal("3")), (at(100), Decimal("9")), (at(0), Decimal("2"))]}, {"H100": Decimal("5"), "cpu": Decimal("1")}
    )
    assert [history.at("H100", at(s)) for s in (-1, 0, 99, 100, 500)] == [Decimal("5"), Decimal("2"), Decimal("2"), Decimal("3"), Decimal("3")]
    assert (history.at("cpu", at(0)), history.at("A100", at(0))) == (Decimal("1"), Decimal(0))
    assert price_at("H100", at(0)) == Decimal("2.50")  # the seeded table, no change recorded


def test_an_attempt_given_twice_is_refused_and_nothing_is_recorded(owner, billing_on):
    with pytest.raises(ValueError):
        usage_close_many(usages=[usage(owner, 1), usage(owner, 1)], now=at(600))
    assert not UsageInterval.objects.unscoped().exists()


@pytest.mark.django_db(transaction=True)  # another connection holds the lock
def test_with_skip_locked_an_organization_another_transaction_holds_is_left_for_later(owner, outsider, billing_on):
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    account_for(owner.organization.pk), account_for(outsider.organization.pk)
    holding, release = threading.Event(), threading.Event()

    def hold_the_owners_account():
        try:
            with transaction.atomic():
                BillingAccount.objects.select_for_update().get(organization=owner.organization)
                holding.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_owners_account)
    holder.start()
    assert holding.wait(timeout=30)
    try:
        usages = [usage(owner, 1), usage(outsider, 2)]
        result = usage_close_many(usages=usages, now=at(60), skip_locked=True)
    finally:
        release.set()
        holder.join()

    assert [row.attempt_id for row in result.closed] == [2]
    assert result.skipped == {owner.organization.pk}
    assert ledger(1) == []
    after = usage_close_many(usages=usages, now=at(60), skip_locked=True)
    assert [(row.attempt_id, row.index) for row in after.closed] == [(1, 0)]
    assert balance(owner) == 10_000_000 - 1667
