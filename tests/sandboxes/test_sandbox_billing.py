"""Sandboxes on the billing ledger (docs/billing.md "Sandboxes"): cores and memory billed at their
own prices from start to stop in intervals, each once (also when closed twice at once), a job's
sandboxes billed to the job, creation refused when nothing of the organization can run, the
standalone sandboxes of an organization that ran out stopped, and the usage API showing them to
their own organization only."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from billing.accounts import BLOCKER_MESSAGES, account_for
from billing.metering import owed_intervals
from billing.models import BillingAccount, Plan, UsageInterval
from jobs.ingest.tokens import job_token
from jobs.models import AttemptState, Job, JobAttempt
from jobs.pipeline.apply import end_attempt_sandboxes
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from lab.models import AuditLogEntry
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from sandboxes.services import sandbox_bill, sandbox_create, sandbox_spec
from sandboxes.tasks import reap_sandboxes
from sandboxes.usage import sandbox_usage_close
from tests.support.billing import at_once
from tests.support.dashboard import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("runtime", "default_prices")]

T0 = datetime(2026, 11, 3, 12, 0, 0, tzinfo=dt_timezone.utc)
TRIAL = 10_000_000
#: 0.5 cores and 2 GB for 150 s at the default prices ($0.05 per core-hour, $0.005 per GB-hour):
#: 0.05 × 0.5 × 150 / 3600 = $0.00104166… → 1,042 micro-dollars; 0.005 × 2 × 150 / 3600 = $0.00041666… → 417.
CPU_COST, MEMORY_COST = 1_042, 417


@pytest.fixture(autouse=True)
def _stop_what_the_test_left(runtime):
    """The session's agent outlives each test's rows: stop the sandboxes a test left running."""
    yield
    for sandbox in Sandbox.objects.unscoped().filter(status__in=ACTIVE_STATUSES):
        runtime.destroy(sandbox_spec(sandbox))


@pytest.fixture
def billing_on(settings, monkeypatch):
    settings.STRIPE_API_KEY = "sk_test_lab"
    settings.LAB_USAGE_INTERVAL_S = 60
    monkeypatch.setattr("billing.ledger.enqueue_meter_events", lambda: None)
    return settings


def ended_sandbox(
    tenant, *, seconds=150, cpu_cores=0.5, memory_gb=2.0, started_at=T0, status=SandboxStatus.STOPPED
) -> Sandbox:
    """A sandbox row of ``tenant`` that ran ``seconds`` from ``started_at`` and stopped (or ``status``)."""
    return Sandbox.objects.create(
        organization=tenant.organization,
        project=tenant.project,
        image="python:3.11",
        cpu_cores=cpu_cores,
        memory_gb=memory_gb,
        disk_gb=1.0,
        timeout_s=3600,
        status=status,
        created_at=started_at,
        started_at=started_at,
        stopped_at=started_at + timedelta(seconds=seconds),
    )


def ledger(sandbox: Sandbox) -> list[tuple]:
    return list(
        UsageInterval.objects.unscoped()
        .filter(sandbox_public_id=sandbox.public_id)
        .order_by("meter", "index")
        .values_list(
            "meter", "index", "resource_type", "cpu_seconds", "memory_gb_seconds", "gpu_seconds", "cost_micro_usd"
        )
    )


def balance(tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro_usd


def test_a_sandbox_is_billed_its_cores_and_memory_once_at_their_own_prices(owner, billing_on):
    sandbox = ended_sandbox(owner)
    account_for(owner.organization.pk)
    closed = sandbox_bill(now=T0 + timedelta(hours=1))
    assert closed == 6
    d = Decimal
    assert ledger(sandbox) == [
        ("sandbox_cpu", 0, "sandbox_cpu", d(30), d(0), d(0), 417),  # 0.05 × 0.5 × 60 / 3600 = $0.000416…
        ("sandbox_cpu", 1, "sandbox_cpu", d(30), d(0), d(0), 416),  # running total 833.3… rounds to 833
        ("sandbox_cpu", 2, "sandbox_cpu", d(15), d(0), d(0), 209),  # 1,041.6… → 1,042 in all
        ("sandbox_memory", 0, "sandbox_memory", d(0), d(120), d(0), 167),
        ("sandbox_memory", 1, "sandbox_memory", d(0), d(120), d(0), 166),
        ("sandbox_memory", 2, "sandbox_memory", d(0), d(60), d(0), 84),
    ]
    assert sum(row[-1] for row in ledger(sandbox)) == CPU_COST + MEMORY_COST
    assert balance(owner) == TRIAL - CPU_COST - MEMORY_COST
    sandbox.refresh_from_db()
    assert sandbox.usage_closed
    # closing it again, either way, records and charges nothing more
    assert sandbox_bill(now=T0 + timedelta(hours=2)) == 0
    Sandbox.objects.unscoped().filter(pk=sandbox.pk).update(usage_closed=False)
    assert sandbox_usage_close(sandbox_ids=[sandbox.pk]).closed == []
    assert UsageInterval.objects.unscoped().count() == 6
    assert balance(owner) == TRIAL - CPU_COST - MEMORY_COST


def test_a_running_sandbox_is_billed_by_interval_and_never_past_its_lifetime(owner, billing_on):
    sandbox = ended_sandbox(owner, status=SandboxStatus.RUNNING)
    Sandbox.objects.unscoped().filter(pk=sandbox.pk).update(stopped_at=None, timeout_s=100)
    sandbox_usage_close(now=T0 + timedelta(seconds=61))
    assert [(meter, index) for meter, index, *_ in ledger(sandbox)] == [("sandbox_cpu", 0), ("sandbox_memory", 0)]
    assert not Sandbox.objects.unscoped().get(pk=sandbox.pk).usage_closed
    # past its lifetime (100 s) it is billed to the lifetime's end, though the reaper has not marked it
    sandbox_usage_close(now=T0 + timedelta(seconds=500))
    rows = ledger(sandbox)
    assert [(meter, index, cpu, memory) for meter, index, _, cpu, memory, *_ in rows] == [
        ("sandbox_cpu", 0, Decimal(30), Decimal(0)),
        ("sandbox_cpu", 1, Decimal(20), Decimal(0)),
        ("sandbox_memory", 0, Decimal(0), Decimal(120)),
        ("sandbox_memory", 1, Decimal(0), Decimal(80)),
    ]
    # the reaper stops it later; its stop adds nothing past the lifetime
    Sandbox.objects.unscoped().filter(pk=sandbox.pk).update(
        status=SandboxStatus.STOPPED, stopped_at=T0 + timedelta(seconds=530)
    )
    sandbox_usage_close(now=T0 + timedelta(seconds=531))
    assert ledger(sandbox) == rows
    assert Sandbox.objects.unscoped().get(pk=sandbox.pk).usage_closed


def test_a_deleted_sandbox_is_billed_from_its_start_to_its_delete(owner, billing_on):
    answer = owner.client().post("/api/v1/sandboxes", {"cpu_cores": 1, "memory_gb": 2}, format="json")
    assert answer.status_code == 201, answer.content
    sandbox_id = answer.json()["id"]
    started = timezone.now() - timedelta(seconds=90)
    Sandbox.objects.unscoped().filter(public_id=sandbox_id).update(created_at=started, started_at=started)
    assert owner.client().delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 204
    sandbox = Sandbox.objects.unscoped().get(public_id=sandbox_id)
    seconds = Decimal((sandbox.stopped_at - started) // timedelta(microseconds=1)) / 1_000_000
    assert sandbox.usage_closed
    rows = UsageInterval.objects.unscoped().filter(sandbox_public_id=sandbox_id)
    assert sorted(set(rows.values_list("meter", "job_public_id", "project_id"))) == [
        ("sandbox_cpu", "", owner.project.pk),
        ("sandbox_memory", "", owner.project.pk),
    ]
    assert sum(row.cpu_seconds for row in rows) == seconds
    assert sum(row.memory_gb_seconds for row in rows) == seconds * 2
    assert [row.ended_at for row in rows.filter(meter="sandbox_cpu").order_by("index")][-1] == sandbox.stopped_at


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
def test_closing_the_same_sandbox_at_once_bills_each_interval_once(owner, billing_on):
    sandbox = ended_sandbox(owner)
    account_for(owner.organization.pk)
    assert at_once(lambda: sandbox_usage_close(sandbox_ids=[sandbox.pk], now=T0 + timedelta(hours=1)), threads=4) == []
    assert [(meter, index) for meter, index, *_ in ledger(sandbox)] == [
        ("sandbox_cpu", 0),
        ("sandbox_cpu", 1),
        ("sandbox_cpu", 2),
        ("sandbox_memory", 0),
        ("sandbox_memory", 1),
        ("sandbox_memory", 2),
    ]
    assert balance(owner) == TRIAL - CPU_COST - MEMORY_COST


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"balance_micro_usd": 0}, "insufficient_credit"),
        ({"monthly_spend_limit_micro_usd": 0}, "spend_limit_reached"),
        ({"payment_failed": True}, "payment_failed"),
    ],
)
def test_creating_a_sandbox_when_billing_allows_nothing_is_refused_and_changes_nothing(owner, billing_on, change, code):
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(**change)
    answer = owner.client().post("/api/v1/sandboxes", {}, format="json")
    assert answer.status_code == 402
    assert answer.json()["error"]["code"] == code
    assert answer.json()["error"]["message"] == BLOCKER_MESSAGES[code]
    assert not Sandbox.objects.unscoped().exists()
    assert not AuditLogEntry.objects.filter(action="sandbox.create").exists()


def test_a_job_attempt_is_refused_a_sandbox_when_billing_allows_nothing(owner, spec, billing_on, monkeypatch):
    monkeypatch.setattr("lab.dispatch.enqueue_on_commit", lambda *args, **kwargs: None)
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.LAUNCHED)
    BillingAccount.objects.filter(organization=owner.organization).update(monthly_spend_limit_micro_usd=0)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(JobAttempt.objects.get(pk=attempt.pk))}")
    answer = engine.post(f"/api/v1/ingest/jobs/{job.public_id}/sandboxes", {"memory_gb": 0.5}, format="json")
    assert answer.status_code == 402
    assert (answer.json()["error"]["code"], answer.json()["error"]["message"]) == (
        "spend_limit_reached",
        BLOCKER_MESSAGES["spend_limit_reached"],
    )
    assert not Sandbox.objects.unscoped().exists()


def test_an_invoiced_organizations_sandboxes_are_not_sent_to_the_gpu_seconds_meter(owner, billing_on):
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(plan=Plan.INVOICED)
    sandbox = ended_sandbox(owner)
    sandbox_bill(now=T0 + timedelta(hours=1))
    assert set(UsageInterval.objects.unscoped().values_list("plan", "billing_enabled", "charged_micro_usd")) == {
        ("invoiced", True, 0)
    }
    assert len(ledger(sandbox)) == 6
    assert owed_intervals(100) == []


def test_billing_off_creates_and_records_without_charging(owner):
    sandbox = ended_sandbox(owner)
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(balance_micro_usd=0)
    assert owner.client().post("/api/v1/sandboxes", {}, format="json").status_code == 201
    sandbox_usage_close(sandbox_ids=[sandbox.pk], now=T0 + timedelta(hours=1))
    assert sum(row[-1] for row in ledger(sandbox)) == CPU_COST + MEMORY_COST
    assert set(UsageInterval.objects.unscoped().values_list("charged_micro_usd", "billing_enabled")) == {(0, False)}
    assert balance(owner) == 0


def test_an_organization_out_of_credit_has_its_own_sandboxes_stopped(owner, outsider, billing_on):
    mine = owner.client().post("/api/v1/sandboxes", {}, format="json").json()["id"]
    theirs = outsider.client().post("/api/v1/sandboxes", {}, format="json").json()["id"]
    started = timezone.now() - timedelta(seconds=61)
    Sandbox.objects.unscoped().update(created_at=started, started_at=started)
    BillingAccount.objects.filter(organization=owner.organization).update(
        balance_micro_usd=100
    )  # less than a minute costs
    reap_sandboxes()  # the reaper's periodic task closes running sandboxes' intervals
    stopped = Sandbox.objects.unscoped().get(public_id=mine)
    assert (stopped.status, stopped.error) == ("stopped", f"Stopped: {BLOCKER_MESSAGES['insufficient_credit']}")
    assert stopped.usage_closed
    assert balance(owner) == 0  # drawn down to the floor, never below
    assert Sandbox.objects.unscoped().get(public_id=theirs).status == SandboxStatus.RUNNING


def test_a_job_attempts_sandbox_is_billed_to_the_job(owner, spec, billing_on, monkeypatch):
    monkeypatch.setattr("lab.dispatch.enqueue_on_commit", lambda *args, **kwargs: None)
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.LAUNCHED)
    attempt = JobAttempt.objects.select_related("job__project__organization").get(pk=attempt.pk)
    sandbox, _ = sandbox_create(
        project=owner.project, actor=Actor(user=owner.user), data={"cpu_cores": 0.5, "memory_gb": 2}, attempt=attempt
    )
    Sandbox.objects.unscoped().filter(pk=sandbox.pk).update(created_at=T0, started_at=T0)
    original = timezone.now
    monkeypatch.setattr("sandboxes.services.timezone.now", lambda: T0 + timedelta(seconds=150))
    end_attempt_sandboxes(attempt.pk, job.public_id)
    monkeypatch.setattr("sandboxes.services.timezone.now", original)
    assert set(
        UsageInterval.objects.unscoped()
        .filter(sandbox_public_id=sandbox.public_id)
        .values_list("job_public_id", "attempt_number")
    ) == {(job.public_id, 1)}
    job.refresh_from_db()
    assert (job.cost_usd, job.gpu_seconds, job.cpu_seconds) == (Decimal("0.001459"), 0.0, 0.0)
    usage = (
        owner.client()
        .get("/api/v1/usage", {"start": "2026-11-01", "end": "2026-12-01", "group_by": "job,resource"})
        .json()["data"]
    )
    assert [
        (row["job_id"], row["resource"], row["cpu_seconds"], row["memory_gb_seconds"], row["cost_usd"]) for row in usage
    ] == [
        (job.public_id, "sandbox_cpu", 75.0, 0.0, "0.001042"),
        (job.public_id, "sandbox_memory", 0.0, 300.0, "0.000417"),
    ]


def test_the_usage_api_shows_sandboxes_to_their_organization_only(owner, outsider, billing_on):
    ended_sandbox(owner)
    sandbox_bill(now=T0 + timedelta(hours=1))
    params = {"start": "2026-11-01", "end": "2026-12-01", "group_by": "day,resource"}
    rows = owner.client().get("/api/v1/usage", params).json()["data"]
    assert rows == [
        {
            "date": "2026-11-03",
            "resource": "sandbox_cpu",
            "gpu_seconds": 0.0,
            "cpu_seconds": 75.0,
            "memory_gb_seconds": 0.0,
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cost_usd": "0.001042",
        },
        {
            "date": "2026-11-03",
            "resource": "sandbox_memory",
            "gpu_seconds": 0.0,
            "cpu_seconds": 0.0,
            "memory_gb_seconds": 300.0,
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cost_usd": "0.000417",
        },
    ]
    assert outsider.client().get("/api/v1/usage", params).json()["data"] == []
    assert Job.objects.unscoped().count() == 0


def test_the_billing_page_charts_sandboxes_by_resource(owner):
    started = timezone.now() - timedelta(seconds=150)
    ended_sandbox(owner, started_at=started)
    sandbox_bill()
    page = signed_in(owner.user).get(f"/o/{owner.organization.slug}/billing/").content.decode()
    chart = json.loads(page.split('<script id="billing-data" type="application/json">')[1].split("</script>")[0])
    assert [(line["resource"], round(sum(line["cost_usd"]), 6)) for line in chart["series"]] == [
        ("sandbox_cpu", 0.001042),
        ("sandbox_memory", 0.000417),
    ]


def test_the_price_table_lists_the_sandbox_prices_with_their_units(owner):
    prices = {price["resource_type"]: price for price in owner.client().get("/api/v1/prices").json()["data"]}
    assert [
        (prices[name]["usd_per_hour"], prices[name]["unit"])
        for name in ("sandbox_cpu", "sandbox_memory", "cpu", "H100")
    ] == [("0.05", "core_hour"), ("0.005", "gb_hour"), ("0.10", "job_hour"), ("2.50", "gpu_hour")]
