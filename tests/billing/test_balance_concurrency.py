"""Many attempts of one organization closing intervals at once on PostgreSQL: every interval is
recorded once, the balance is exact, and it never goes below the grace floor, whether each worker
closes one attempt at a time (``usage_close``) or all of them in one batch (``usage_close_many``,
waiting for the account lock or skipping it as a reconciler pass does)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from billing.accounts import account_for
from billing.ledger import AttemptUsage, usage_close, usage_close_many
from billing.models import BillingAccount, UsageInterval
from tests.billing.conftest import T0
from tests.support.billing import at_once

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("default_prices")]

WORKERS = 8


PATHS = ["one_at_a_time", "batch", "batch_skip_locked"]


def close_concurrently(tenant, attempts: int, *, seconds: int, path: str) -> list[Exception]:
    """Close ``seconds`` of H100 usage (1 GPU) for each of ``attempts`` attempts, from 8 threads at once,
    each thread closing every attempt (so each interval is tried 8 times) along ``path``."""
    usages = [
        AttemptUsage(
            organization_id=tenant.organization.pk, project_id=tenant.project.pk, job_public_id=f"job_{attempt_id}",
            attempt_id=attempt_id, attempt_number=1, resource_type="H100", gpus=1,
            started_at=T0, ended_at=T0 + timedelta(seconds=seconds),
        )
        for attempt_id in range(1, attempts + 1)
    ]
    now = T0 + timedelta(seconds=seconds + 1)

    def work():
        if path == "one_at_a_time":
            for usage in usages:
                usage_close(usage=usage, now=now)
        else:
            usage_close_many(usages=usages, now=now, skip_locked=path == "batch_skip_locked")

    return at_once(work, threads=WORKERS)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("row locks under concurrency need PostgreSQL")


@pytest.mark.parametrize("path", PATHS)
def test_the_balance_is_exact_when_credit_suffices(owner, billing_on, path):
    account_for(owner.organization.pk)
    errors = close_concurrently(owner, attempts=20, seconds=300, path=path)  # 20 × 5 GPU-minutes of H100 at $2.50/h
    assert errors == []
    rows = UsageInterval.objects.for_project(owner.project)
    assert rows.count() == 20 * 5
    # each attempt: 300 s at $2.50/h = $0.208333.. → 208333 micro-dollars (rounded once per attempt)
    assert sum(rows.values_list("cost_micro_usd", flat=True)) == 20 * 208333
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == 10_000_000 - 20 * 208333


@pytest.mark.parametrize("path", PATHS)
def test_the_balance_never_goes_below_the_grace(owner, billing_on, path):
    billing_on.LAB_CREDIT_GRACE_USD = Decimal("0.50")
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(balance_micro_usd=1_000_000)  # $1.00 left
    errors = close_concurrently(owner, attempts=12, seconds=600, path=path)  # $0.416667 each: $5.00 used in all

    assert errors == []
    rows = UsageInterval.objects.for_project(owner.project)
    assert rows.count() == 12 * 10
    costs = sum(rows.values_list("cost_micro_usd", flat=True))
    charged = sum(rows.values_list("charged_micro_usd", flat=True))
    assert costs == 12 * 416667  # the usage is recorded in full
    assert charged == 1_500_000  # $1.00 and the $0.50 grace, not a micro-dollar more
    assert BillingAccount.objects.get(pk=account.pk).balance_micro_usd == -500_000
