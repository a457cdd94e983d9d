"""The usage ledger: intervals measured by the launcher, closed once, priced at the price then."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from billing.ledger import AttemptUsage, job_usage_totals, usage_close
from billing.models import BillingAccount, UsageInterval
from billing.pricing import price_at, price_set
from jobs.pipeline import reconciler
from jobs.models import Job, JobStatus
from jobs.services import job_delete
from lab.audit import Actor
from tests.billing.conftest import T0, at, observe, start_job
from tests.support.billing import at_once

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]


def intervals(job) -> list[UsageInterval]:
    return list(UsageInterval.objects.unscoped().filter(job_public_id=job.public_id).order_by("attempt_number", "index"))


def reconcile_at(monkeypatch, job, moment) -> None:
    monkeypatch.setattr(timezone, "now", lambda: moment)
    reconciler.reconcile_job(job_id=job.pk)


def test_it_closes_whole_intervals_while_running_and_the_last_one_at_the_end(owner, spec, launcher, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt)

    reconcile_at(monkeypatch, job, at(59))
    assert intervals(job) == []
    reconcile_at(monkeypatch, job, at(150))
    assert [(i.index, i.started_at, i.ended_at) for i in intervals(job)] == [(0, at(0), at(60)), (1, at(60), at(120))]

    observe(launcher, attempt, ended_at=at(130.5), exit_code=0)
    reconcile_at(monkeypatch, job, at(200))

    rows = intervals(job)
    assert [(i.index, i.started_at, i.ended_at) for i in rows] == [
        (0, at(0), at(60)), (1, at(60), at(120)), (2, at(120), at(130.5))
    ]
    # cpu at $0.10 per job-hour: 60 s = 1666.67 micro-dollars, 10.5 s = 291.67; each interval is the
    # rounded running total less the previous one, so they add up to 130.5 s = 3625 exactly
    assert [(i.cpu_seconds, i.gpu_seconds, i.cost_micro_usd) for i in rows] == [
        (Decimal("60"), Decimal("0"), 1667), (Decimal("60"), Decimal("0"), 1666), (Decimal("10.5"), Decimal("0"), 292)
    ]
    job = Job.objects.unscoped().get(pk=job.pk)
    assert job.status == JobStatus.SUCCEEDED
    assert (job.cpu_seconds, job.gpu_seconds, job.cost_usd) == (130.5, 0.0, Decimal("0.003625"))


def test_gpu_seconds_are_wall_seconds_times_gpus(owner, spec, launcher, monkeypatch, settings):
    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 1}]}
    spec["resources"] = {"gpu_type": "H100", "gpus": 4}
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt)

    reconcile_at(monkeypatch, job, at(60))

    [row] = intervals(job)
    # 4 GPUs × 60 s = 240 GPU-seconds at $2.50 per GPU-hour = $0.166667
    assert (row.units, row.gpu_seconds, row.cpu_seconds, row.cost_micro_usd) == (4, Decimal("240"), Decimal("0"), 166667)


def test_reconciling_again_records_nothing_twice(owner, spec, launcher, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt, ended_at=at(90), exit_code=0)
    reconcile_at(monkeypatch, job, at(100))
    first = [(i.public_id, i.index) for i in intervals(job)]

    usage = AttemptUsage(
        organization_id=owner.organization.pk, project_id=owner.project.pk, job_public_id=job.public_id,
        attempt_id=attempt.pk, attempt_number=1, resource_type="cpu", gpus=0, started_at=T0, ended_at=at(90),
    )
    assert usage_close(usage=usage, now=at(500)).closed == []

    assert [(i.public_id, i.index) for i in intervals(job)] == first
    assert [index for _, index in first] == [0, 1]


@pytest.mark.django_db(transaction=True)  # threads, each on its own connection
def test_two_workers_closing_the_same_attempt_at_once_record_each_interval_once(owner, spec, launcher, billing_on):
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    job, attempt = start_job(owner, spec, launcher)
    usage = AttemptUsage(
        organization_id=owner.organization.pk, project_id=owner.project.pk, job_public_id=job.public_id,
        attempt_id=attempt.pk, attempt_number=1, resource_type="cpu", gpus=0, started_at=T0, ended_at=at(600),
    )
    errors = at_once(lambda: usage_close(usage=usage, now=at(700)), threads=6)

    assert errors == []
    assert [i.index for i in intervals(job)] == list(range(10))
    account = BillingAccount.objects.get(organization=owner.organization)
    # $10 trial less ten minutes of one CPU job ($0.10/h): 16666.67 micro-dollars, rounded once
    assert account.balance_micro_usd == 10_000_000 - 16667


def test_a_price_edited_mid_job_leaves_closed_intervals_at_the_old_price(owner, spec, launcher, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt)
    reconcile_at(monkeypatch, job, at(125))

    monkeypatch.setattr(timezone, "now", lambda: at(130))
    price_set(resource_type="cpu", usd_per_hour=Decimal("0.40"))
    observe(launcher, attempt, ended_at=at(180), exit_code=0)
    reconcile_at(monkeypatch, job, at(190))

    assert [(i.usd_per_hour, i.cost_micro_usd) for i in intervals(job)] == [
        (Decimal("0.1000"), 1667), (Decimal("0.1000"), 1666), (Decimal("0.4000"), 6667)
    ]
    assert price_at("cpu", at(100)) == Decimal("0.10")
    assert price_at("cpu", at(131)) == Decimal("0.40")
    assert Job.objects.unscoped().get(pk=job.pk).cost_usd == Decimal("0.010000")


def test_every_attempt_counts_toward_the_job_usage(owner, spec, launcher, monkeypatch):
    spec["max_restarts"] = 2
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt, ended_at=at(30), exit_code=1)  # a crash: requeued
    reconcile_at(monkeypatch, job, at(40))
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED

    totals = job_usage_totals(job.public_id)
    assert (totals.cpu_seconds, totals.cost_micro_usd) == (Decimal("30"), 833)


def test_a_pending_attempt_is_not_billed(owner, spec, launcher, monkeypatch):
    from jobs.launchers.base import AttemptPhase, Observation

    job, attempt = start_job(owner, spec, launcher)
    launcher.observations[attempt.handle["id"]] = Observation(AttemptPhase.PENDING, started_at=None)
    reconcile_at(monkeypatch, job, at(600))
    assert intervals(job) == []


def test_a_deleted_job_leaves_its_usage_in_the_ledger(owner, spec, launcher, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt, ended_at=at(61), exit_code=0)
    reconcile_at(monkeypatch, job, at(70))
    monkeypatch.undo()

    job_delete(job=Job.objects.unscoped().get(pk=job.pk), actor=Actor(user=owner.user))

    assert [i.index for i in UsageInterval.objects.unscoped().filter(job_public_id=job.public_id)] == [0, 1]
