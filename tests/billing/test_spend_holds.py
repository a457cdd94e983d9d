"""Started jobs hold their estimate not yet charged against the monthly spend limit and the
prepaid balance, so admission never starts what the organization could not pay beside them (one
pass after another, and passes run at once on PostgreSQL); a job stopped at the spend limit fails
``spend_limit_reached``, one stopped for credit ``insufficient_credit``."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from billing.accounts import account_for
from billing.models import BillingAccount, Price, PriceChange
from jobs.pipeline import reconciler
from jobs.admission import admission_pass
from jobs.models import AttemptState, Job, JobAttempt, JobStatus, StopReason
from jobs.readmission import PARKED, attempt_open_for_pod
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.api.errors import http_status
from lab.audit import Actor
from lab.errors import LabError
from tests.billing.conftest import at, observe, start_job
from tests.support.billing import at_once

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]

DOLLAR = 1_000_000


@pytest.fixture
def dollar_a_minute(billing_on, settings):
    """CPU jobs cost $60/h ($1.00 a 60 s interval); three local slots, a cap of 10 jobs."""
    for prices in (Price.objects, PriceChange.objects):  # the price in force at any time
        prices.filter(resource_type="cpu").update(usd_per_hour=Decimal(60))
    settings.LAB_LOCAL_SLOTS = 3
    settings.LAB_ORG_MAX_RUNNING_JOBS = 10
    return billing_on


def set_account(tenant, **fields) -> None:
    account = account_for(tenant.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(**fields)


def headroom(tenant, bound: str, micro_usd: int) -> None:
    """Leave ``tenant``'s organization ``micro_usd`` to spend, bounded by its monthly spend limit
    (nothing spent yet, $10.00 of credit) or by its prepaid balance (no limit)."""
    if bound == "spend_limit":
        set_account(tenant, monthly_spend_limit_micro_usd=micro_usd, balance_micro_usd=10 * DOLLAR)
    else:
        set_account(tenant, monthly_spend_limit_micro_usd=None, balance_micro_usd=micro_usd)


def estimate(job: Job, usd: str) -> Job:
    """Give ``job`` an estimated cost of ``usd`` (what submission computed from its spec otherwise)."""
    Job.objects.unscoped().filter(pk=job.pk).update(estimated_cost_usd=Decimal(usd))
    return Job.objects.unscoped().get(pk=job.pk)


def state(job: Job) -> tuple[str, str]:
    job = Job.objects.unscoped().get(pk=job.pk)
    return job.status, job.status_reason


def balance(tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro_usd


@pytest.mark.parametrize("bound", ["spend_limit", "balance"])
def test_a_running_jobs_uncharged_estimate_keeps_the_next_job_waiting_until_it_ends(
    owner, spec, launcher, dollar_a_minute, monkeypatch, bound
):
    monkeypatch.setattr(timezone, "now", lambda: at(0))
    headroom(owner, bound, 5 * DOLLAR)
    first, attempt = start_job(owner, spec, launcher)
    first = estimate(first, "3.00")
    observe(launcher, attempt)  # running since T0, nothing charged yet
    second = estimate(job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec), "3.00")

    assert admission_pass().started == []  # $3.00 held by the first + $3.00 > $5.00
    assert state(second) == (JobStatus.QUEUED, "payment_required")

    monkeypatch.setattr(timezone, "now", lambda: at(61))
    reconciler.reconcile_job(job_id=first.pk)  # its first minute charged: $1.00 spent, $2.00 still held
    assert Job.objects.unscoped().get(pk=first.pk).cost_usd == Decimal("1.00")
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == ""
    assert admission_pass().started == []
    assert state(second) == (JobStatus.QUEUED, "payment_required")

    observe(launcher, attempt, ended_at=at(90), exit_code=0)  # it finished under its estimate
    monkeypatch.setattr(timezone, "now", lambda: at(95))
    reconciler.reconcile_job(job_id=first.pk)
    assert Job.objects.unscoped().get(pk=first.pk).cost_usd == Decimal("1.50")
    assert balance(owner) == (10 if bound == "spend_limit" else 5) * DOLLAR - 1_500_000

    assert admission_pass().started == [second.pk]  # nothing held: $3.50 left
    assert state(second)[0] == JobStatus.STARTING


def test_a_starting_job_holds_its_estimate_from_one_pass_to_the_next(owner, spec, dollar_a_minute):
    headroom(owner, "spend_limit", 5 * DOLLAR)
    first = estimate(job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec), "3.00")
    assert admission_pass().started == [first.pk]
    second = estimate(job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec), "2.00")
    third = estimate(job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec), "0.01")

    assert admission_pass().started == [second.pk]  # $3.00 + $2.00 fill the $5.00
    assert state(third) == (JobStatus.QUEUED, "payment_required")
    estimated = owner.client().post("/api/v1/jobs/estimate", spec, format="json").json()
    assert (estimated["can_start_now"], estimated["reason"]) == (False, "payment_required")

    Job.objects.unscoped().filter(pk=second.pk).update(status=JobStatus.CANCELLED)  # ended without any usage
    assert admission_pass().started == [third.pk]


def test_an_invoiced_organization_without_a_limit_holds_nothing(owner, spec, dollar_a_minute):
    set_account(owner, plan="invoiced", balance_micro_usd=0, monthly_spend_limit_micro_usd=None)
    jobs = [estimate(job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec), "1000.00") for _ in range(3)]
    assert sorted(admission_pass().started) == sorted(job.pk for job in jobs)


def test_a_jobset_kueue_readmits_waits_while_started_jobs_hold_the_headroom(owner, spec, launcher, dollar_a_minute):
    headroom(owner, "spend_limit", 5 * DOLLAR)
    parked = estimate(job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec), "3.00")
    first = job_claim_for_start(job_id=parked.pk, handle={"jobset": "js-parked"})
    JobAttempt.objects.filter(pk=first.pk).update(state=AttemptState.ENDED, handle={"jobset": "js-parked", PARKED: True})
    job_transition(job=Job.objects.unscoped().get(pk=parked.pk), to=JobStatus.QUEUED, reason="requeued_after_preemption")
    running, _ = start_job(owner, spec, launcher)
    estimate(running, "3.00")

    with pytest.raises(LabError) as refused:  # Kueue readmitted the parked JobSet; its pod asks to open an attempt
        attempt_open_for_pod(job_public_id=parked.public_id, pod_uid="pod-2", jobset="js-parked")
    assert (http_status(refused.value), refused.value.code) == (409, "attempt_not_ready")
    assert "spend_limit_reached" in refused.value.message
    assert (state(parked), Job.objects.unscoped().get(pk=parked.pk).attempt) == ((JobStatus.QUEUED, "requeued_after_preemption"), 1)

    Job.objects.unscoped().filter(pk=running.pk).update(status=JobStatus.CANCELLED)  # ended without any usage
    assert attempt_open_for_pod(job_public_id=parked.public_id, pod_uid="pod-2", jobset="js-parked").attempt == 2


@pytest.mark.parametrize("bound", ["spend_limit", "balance"])
@pytest.mark.django_db(transaction=True)  # threads, each on its own connection
def test_concurrent_submissions_start_only_the_job_the_headroom_fits(owner, spec, dollar_a_minute, bound):
    if connection.vendor != "postgresql":
        pytest.skip("admission passes at once need PostgreSQL")
    probe = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    one_job = round(probe.estimated_cost_usd * DOLLAR)  # what the spec is estimated to cost at $60/h
    Job.objects.unscoped().filter(pk=probe.pk).delete()
    assert one_job > 0
    headroom(owner, bound, one_job * 3 // 2)  # one job and a half
    answers = []

    def submit_and_admit():
        answers.append(owner.client().post("/api/v1/jobs", spec, format="json").status_code)
        admission_pass()  # what the submission enqueues, here in the request's thread

    assert at_once(submit_and_admit, threads=3) == []

    assert answers == [201, 201, 201]
    jobs = Job.objects.for_project(owner.project)
    assert sorted(jobs.values_list("status", "status_reason")) == [
        (JobStatus.QUEUED, "payment_required"),
        (JobStatus.QUEUED, "payment_required"),
        (JobStatus.STARTING, ""),
    ]
    assert admission_pass().started == []


@pytest.mark.parametrize(
    "fields, stop_reason, error_code, message",
    [
        pytest.param(
            {"monthly_spend_limit_micro_usd": 1_500_000}, StopReason.SPEND_LIMIT, "spend_limit_reached",
            "The organization reached its monthly spend limit of $1.50; raise the limit (or wait for next month) "
            "and restart the job.",
            id="spend limit",
        ),
        pytest.param({"balance_micro_usd": 1_500_000}, StopReason.CREDIT, "insufficient_credit", "Out of credit.", id="credit"),
        pytest.param(
            {"monthly_spend_limit_micro_usd": 1_500_000, "balance_micro_usd": 1_500_000}, StopReason.SPEND_LIMIT,
            "spend_limit_reached",
            "The organization reached its monthly spend limit of $1.50; raise the limit (or wait for next month) "
            "and restart the job.",
            id="both",
        ),
    ],
)
def test_a_job_stopped_by_the_spend_limit_says_so(owner, spec, launcher, dollar_a_minute, monkeypatch, fields, stop_reason, error_code, message):
    set_account(owner, **fields)
    job, attempt = start_job(owner, spec, launcher)
    observe(launcher, attempt)

    monkeypatch.setattr(timezone, "now", lambda: at(121))
    reconciler.reconcile_job(job_id=job.pk)  # $2.00 spent: past the $1.50
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == stop_reason

    observe(launcher, attempt, ended_at=at(125), exit_code=3)  # it checkpointed and exited
    monkeypatch.setattr(timezone, "now", lambda: at(130))
    reconciler.reconcile_job(job_id=job.pk)
    monkeypatch.undo()

    job.refresh_from_db()
    assert (job.status, job.error_code, job.error_message) == (JobStatus.FAILED, error_code, message)
    body = owner.client().get(f"/api/v1/jobs/{job.public_id}").json()
    assert body["error"] == {"code": error_code, "message": message}
