"""Enforcement with billing on: 402 when nothing can run, admission's payment_required, a running
job stopped when credit runs out (failed, insufficient_credit) and continued after a top-up.
With billing off nothing is enforced."""

from __future__ import annotations

import pytest
from django.utils import timezone

from billing.accounts import account_for, credit_add
from billing.models import BillingAccount, CreditKind
from jobs.pipeline import reconciler
from jobs.admission import admission_pass
from jobs.models import Checkpoint, CheckpointStatus, Job, JobAttempt, JobStatus, StopReason
from jobs.services import job_transition
from tests.billing.conftest import at, observe, start_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]


def set_account(tenant, **fields) -> None:
    account = account_for(tenant.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(**fields)


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"balance_micro_usd": 0}, "insufficient_credit"),
        ({"payment_failed": True}, "payment_failed"),
        ({"plan": "invoiced", "payment_failed": True}, "payment_failed"),
        ({"monthly_spend_limit_micro_usd": 0}, "spend_limit_reached"),
    ],
)
def test_post_jobs_is_402_when_nothing_can_run(owner, spec, billing_on, fields, code):
    set_account(owner, **fields)
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 402, response.content
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["type"] == "payment_error"
    assert Job.objects.for_project(owner.project).count() == 0


def test_an_invoiced_organization_without_credit_still_runs(owner, spec, billing_on):
    set_account(owner, plan="invoiced", balance_micro_usd=0)
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201


def test_without_billing_nothing_is_enforced(owner, spec):
    set_account(owner, balance_micro_usd=-5_000_000, payment_failed=True)
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201
    assert admission_pass().started != []


def test_admission_leaves_a_job_queued_when_its_estimate_exceeds_what_is_left(owner, spec, billing_on):
    job_id = owner.client().post("/api/v1/jobs", spec, format="json").json()["id"]
    job = Job.objects.for_project(owner.project).get(public_id=job_id)
    assert job.estimated_cost_usd > 0
    set_account(owner, balance_micro_usd=1)  # one micro-dollar left: less than the estimate

    assert admission_pass().started == []
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (JobStatus.QUEUED, "payment_required")
    estimate = owner.client().post("/api/v1/jobs/estimate", spec, format="json").json()
    assert (estimate["can_start_now"], estimate["reason"]) == (False, "payment_required")

    credit_add(organization_id=owner.organization.pk, amount_micro_usd=5_000_000, kind=CreditKind.PURCHASE, reference="cs_1")
    assert admission_pass().started == [job.pk]


def test_a_running_job_that_runs_out_stops_fails_and_continues_after_a_top_up(owner, spec, launcher, billing_on, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    set_account(owner, balance_micro_usd=2000)  # 72 s of a CPU job at $0.10/h
    observe(launcher, attempt)
    checkpoint = Checkpoint.objects.create(job=job, step=4, attempt=1, format="peft-lora", status=CheckpointStatus.READY)

    monkeypatch.setattr(timezone, "now", lambda: at(60))
    reconciler.reconcile_job(job_id=job.pk)
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == ""  # 1667 charged, 333 left

    monkeypatch.setattr(timezone, "now", lambda: at(120))
    reconciler.reconcile_job(job_id=job.pk)
    attempt.refresh_from_db()
    assert attempt.stop_reason == StopReason.CREDIT  # the engine's next status answer is "stop"
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == 0

    observe(launcher, attempt, ended_at=at(125), exit_code=3)  # it checkpointed and exited
    monkeypatch.setattr(timezone, "now", lambda: at(130))
    reconciler.reconcile_job(job_id=job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "insufficient_credit")
    assert owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["error"]["code"] == "insufficient_credit"
    monkeypatch.undo()

    refused = owner.client().post(f"/api/v1/jobs/{job.public_id}/restart")
    assert (refused.status_code, refused.json()["error"]["code"]) == (402, "insufficient_credit")
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.FAILED

    credit_add(organization_id=owner.organization.pk, amount_micro_usd=10_000_000, kind=CreditKind.PURCHASE, reference="cs_2")
    restarted = owner.client().post(f"/api/v1/jobs/{job.public_id}/restart")
    assert restarted.status_code == 200
    assert admission_pass().started == [job.pk]
    assert Job.objects.unscoped().get(pk=job.pk).attempt == 2
    assert JobAttempt.objects.get(job=job, number=2).resume_from == checkpoint  # it continues from its checkpoint


def test_without_billing_a_job_is_never_stopped_for_credit(owner, spec, launcher, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    set_account(owner, balance_micro_usd=0)
    observe(launcher, attempt)
    monkeypatch.setattr(timezone, "now", lambda: at(600))
    reconciler.reconcile_job(job_id=job.pk)
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == ""
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == 0


def test_the_spend_limit_stops_an_invoiced_job_too(owner, spec, launcher, billing_on, monkeypatch):
    job, attempt = start_job(owner, spec, launcher)
    set_account(owner, plan="invoiced", balance_micro_usd=0, monthly_spend_limit_micro_usd=3000)
    observe(launcher, attempt)
    monkeypatch.setattr(timezone, "now", lambda: at(121))
    reconciler.reconcile_job(job_id=job.pk)
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == StopReason.SPEND_LIMIT
    account = BillingAccount.objects.get(organization=owner.organization)
    assert account.balance_micro_usd == 0  # invoiced: never drawn from credit


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"balance_micro_usd": 0}, "insufficient_credit"),
        ({"payment_failed": True}, "payment_failed"),
        ({"monthly_spend_limit_micro_usd": 0}, "spend_limit_reached"),
    ],
)
def test_the_prime_routes_that_start_a_run_are_402_when_nothing_can_run(owner, billing_on, fields, code):
    from billing.accounts import BLOCKER_MESSAGES
    from tests.support.prime_configs import tiny_config

    client = owner.client()
    submitted = client.post("/prime/api/v1/training/runs", {"config": tiny_config()}, format="json")
    assert submitted.status_code == 200, submitted.content
    job = Job.objects.for_project(owner.project).get(public_id=submitted.json()["runId"])
    job_transition(job=job, to=JobStatus.FAILED, error_code="internal_error", error_message="lost")
    set_account(owner, **fields)

    refusals = [
        client.post("/prime/api/v1/training/runs", {"config": tiny_config()}, format="json"),
        client.post(f"/prime/api/v1/training/runs/{job.public_id}/resume", {}, format="json"),
        client.put(f"/prime/api/v1/rft/runs/{job.public_id}/restart"),
    ]

    assert [(refused.status_code, refused.json()) for refused in refusals] == [(402, {"detail": BLOCKER_MESSAGES[code]})] * 3
    assert Job.objects.for_project(owner.project).count() == 1
    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.FAILED, 0)  # never queued again
