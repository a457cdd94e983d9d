"""A reconciler pass closes the usage of its running jobs in one ledger batch (no job lock), sets
their totals from the ledger, and leaves what it could not close to each job's own turn."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.accounts import account_for
from billing.models import BillingAccount, UsageInterval
from jobs.pipeline import reconciler, usage
from jobs.models import Job, JobAttempt, StopReason
from tests.billing.conftest import at, observe, start_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]


@pytest.fixture
def many_running(owner, outsider, spec, launcher, settings):
    """Three running CPU jobs of Acme and two of Globex, each measured running since ``T0``."""
    settings.LAB_ORG_MAX_RUNNING_JOBS = 10
    started = [start_job(tenant, spec, launcher) for tenant in (owner, owner, owner, outsider, outsider)]
    for _, attempt in started:
        observe(launcher, attempt)
    return [job for job, _ in started]


def pass_at(monkeypatch, moment) -> list[str]:
    """Run a reconciler pass at ``moment``; return the SQL it ran."""
    monkeypatch.setattr(timezone, "now", lambda: moment)
    with CaptureQueriesContext(connection) as captured:
        reconciler.reconcile_all()
    return [query["sql"] for query in captured]


def test_a_pass_closes_every_running_jobs_intervals_in_one_batch_and_sets_their_totals(
    owner, outsider, many_running, billing_on, monkeypatch
):
    queries = pass_at(monkeypatch, at(130))

    if connection.vendor == "postgresql":  # SQLite locks the whole database, never rows
        locks = [sql for sql in queries if "FOR UPDATE" in sql]
        assert len(locks) == 1 and '"billing_billingaccount"' in locks[0]  # both accounts at once; no job locked
    assert sum(sql.startswith('INSERT INTO "billing_usageinterval"') for sql in queries) == 1
    for job in many_running:
        rows = UsageInterval.objects.unscoped().filter(job_public_id=job.public_id).order_by("index")
        assert [(row.index, row.cost_micro_usd) for row in rows] == [(0, 1667), (1, 1666)]
        job.refresh_from_db()
        assert (job.cpu_seconds, job.gpu_seconds, job.cost_usd) == (120.0, 0.0, Decimal("0.003333"))
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == 10_000_000 - 3 * 3333
    assert BillingAccount.objects.get(organization=outsider.organization).balance_micro_usd == 10_000_000 - 2 * 3333

    again = pass_at(monkeypatch, at(130))
    assert not any("FOR UPDATE" in sql for sql in again)
    assert UsageInterval.objects.unscoped().count() == 5 * 2


def test_what_the_batch_could_not_close_is_closed_by_each_jobs_own_turn(many_running, billing_on, monkeypatch):
    def fail(**kwargs):
        raise RuntimeError("the ledger is unreachable")

    monkeypatch.setattr(usage, "usage_close_many", fail)
    pass_at(monkeypatch, at(130))

    for job in many_running:
        assert UsageInterval.objects.unscoped().filter(job_public_id=job.public_id).count() == 2
        job.refresh_from_db()
        assert job.cost_usd == Decimal("0.003333")


def test_an_organization_out_of_credit_after_the_batch_has_its_jobs_asked_to_stop(owner, many_running, billing_on, monkeypatch):
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(balance_micro_usd=5000)  # less than 3 × 3333

    pass_at(monkeypatch, at(130))

    assert BillingAccount.objects.get(pk=account.pk).balance_micro_usd == 0
    reasons = {job.public_id: JobAttempt.objects.get(job=job, number=1).stop_reason for job in many_running}
    assert list(reasons.values()) == [StopReason.CREDIT] * 3 + [""] * 2


def test_the_totals_are_never_lowered_by_an_older_sum(owner, many_running, monkeypatch):
    job = many_running[0]
    pass_at(monkeypatch, at(130))
    Job.objects.unscoped().filter(pk=job.pk).update(cpu_seconds=180.0, cost_usd=Decimal("0.005"))  # a newer write

    usage.raise_usage_totals({job.public_id})  # the sums of two intervals, 120 s

    job.refresh_from_db()
    assert (job.cpu_seconds, job.cost_usd) == (180.0, Decimal("0.005000"))
    Job.objects.unscoped().filter(pk=job.pk).update(cpu_seconds=0.0, cost_usd=Decimal(0))
    usage.raise_usage_totals({job.public_id})
    job.refresh_from_db()
    assert (job.cpu_seconds, job.cost_usd) == (120.0, Decimal("0.003333"))


def test_an_invoiced_jobs_usage_closed_by_passes_goes_to_stripe_once_and_draws_no_credit(
    owner, spec, launcher, fake_stripe, monkeypatch
):
    from billing.metering import meter_events_send

    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(plan="invoiced", stripe_customer_id="cus_inv")
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt)

    pass_at(monkeypatch, at(130))
    pass_at(monkeypatch, at(130))
    assert meter_events_send() == 2
    pass_at(monkeypatch, at(190))
    assert (meter_events_send(), meter_events_send()) == (1, 0)

    identifiers = [request["form"]["identifier"] for request in fake_stripe.calls("/v1/billing/meter_events")]
    assert sorted(identifiers) == sorted(UsageInterval.objects.unscoped().filter(job_public_id=job.public_id).values_list("public_id", flat=True))
    assert len(identifiers) == 3
    assert BillingAccount.objects.get(pk=account.pk).balance_micro_usd == 10_000_000
