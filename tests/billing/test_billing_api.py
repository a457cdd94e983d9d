"""GET /billing/balance, GET /usage, PATCH /billing/settings: shapes, roles, outsiders, bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.accounts import account_for
from billing.models import BillingAccount, UsageInterval
from lab.audit import Actor
from lab.models import AuditLogEntry, Organization
from lab.services import api_key_create
from tests.support.billing import record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("default_prices")]
NO_TOKENS = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}


def test_it_answers_the_balance_of_a_new_organization_with_the_trial_credit(owner):
    response = owner.client().get("/api/v1/billing/balance")
    assert response.status_code == 200
    assert response.json() == {
        "object": "balance", "plan": "prepaid", "balance_usd": "10.00", "spend_limit_usd": None,
        "spent_this_month_usd": "0.00", "payment_failed": False, "billing_enabled": False, "max_running_jobs": None,
    }


def test_it_draws_the_balance_down_only_when_billing_is_on(owner, billing_on):
    record(owner, seconds=3600)  # one CPU job-hour: $0.10
    body = owner.client().get("/api/v1/billing/balance").json()
    assert (body["balance_usd"], body["spent_this_month_usd"], body["billing_enabled"]) == ("9.90", "0.10", True)


def test_usage_without_billing_is_recorded_but_never_charged(owner):
    record(owner, seconds=3600)
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == 10_000_000
    assert owner.client().get("/api/v1/billing/balance").json()["spent_this_month_usd"] == "0.10"


def test_it_groups_usage_by_day_resource_and_job(owner, settings):
    # Noon of yesterday: a day wholly before the query's default end (now), whatever the hour.
    latest = (timezone.now() - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    record(owner, job_id="job_a", seconds=600, attempt_id=1, ended=latest - timedelta(days=1))
    record(owner, job_id="job_b", seconds=60, resource="H100", gpus=2, attempt_id=2, ended=latest)
    client = owner.client()
    start = (latest - timedelta(days=2)).date().isoformat()

    by_day = client.get(f"/api/v1/usage?start={start}&group_by=day").json()
    assert by_day["object"] == "list" and by_day["has_more"] is False
    assert by_day["data"] == [
        {"date": (latest - timedelta(days=1)).date().isoformat(), "gpu_seconds": 0.0, "cpu_seconds": 600.0, "memory_gb_seconds": 0.0, **NO_TOKENS, "cost_usd": "0.016667"},
        {"date": latest.date().isoformat(), "gpu_seconds": 120.0, "cpu_seconds": 0.0, "memory_gb_seconds": 0.0, **NO_TOKENS, "cost_usd": "0.083333"},
    ]
    by_resource = client.get(f"/api/v1/usage?start={start}&group_by=resource").json()["data"]
    assert [(row["resource"], row["cost_usd"]) for row in by_resource] == [("H100", "0.083333"), ("cpu", "0.016667")]
    by_job = client.get(f"/api/v1/usage?start={start}&group_by=job").json()["data"]
    assert [(row["job_id"], row["gpu_seconds"]) for row in by_job] == [("job_a", 0.0), ("job_b", 120.0)]
    both = client.get(f"/api/v1/usage?start={start}&group_by=day,resource&job_id=job_b").json()["data"]
    assert both == [{"date": latest.date().isoformat(), "resource": "H100", "gpu_seconds": 120.0, "cpu_seconds": 0.0, "memory_gb_seconds": 0.0, **NO_TOKENS, "cost_usd": "0.083333"}]
    assert client.get(f"/api/v1/usage?start={start}&end={start}T12:00:00Z").json()["data"] == []


@pytest.mark.parametrize(
    "query, param",
    [
        ("group_by=week", "group_by"),
        ("group_by=day,day", "group_by"),
        ("start=yesterday", "start"),
        ("start=2026-13-01", "start"),
        ("end=" + "9" * 200, "end"),
        ("start=2026-11-02&end=2026-11-01", "end"),
        ("start=0001-01-01T00:00:00%2B05:00", "start"),
        ("end=9999-12-31T23:59:59-05:00", "end"),
        ("start=2026-11-01T25:00:00Z", "start"),
        ("start=%00", None),  # refused by lab.middleware before the view
    ],
)
def test_it_refuses_bad_usage_queries(owner, query, param):
    response = owner.client().get(f"/api/v1/usage?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_an_outsider_sees_neither_usage_nor_balance_of_another_organization(owner, outsider, billing_on):
    record(owner, job_id="job_acme", seconds=3600)
    client = outsider.client()
    response = client.get("/api/v1/usage?job_id=job_acme")
    assert response.status_code == 404
    assert response.json() == owner.client().get("/api/v1/usage?job_id=job_missing").json()
    assert client.get("/api/v1/usage?group_by=job").json()["data"] == []
    body = client.get("/api/v1/billing/balance").json()
    assert (body["balance_usd"], body["spent_this_month_usd"]) == ("10.00", "0.00")


def test_usage_read_with_a_key_covers_only_its_project(owner):
    from lab.services import project_create

    other = project_create(actor=Actor(user=owner.user), organization=owner.organization, name="Other")
    _, key = api_key_create(actor=Actor(user=owner.user), project=other, name="other")
    record(owner, job_id="job_default", seconds=60)
    assert owner.client(key).get("/api/v1/usage?group_by=job").json()["data"] == []
    # the balance is the organization's, whichever project the key belongs to
    assert owner.client(key).get("/api/v1/billing/balance").json()["spent_this_month_usd"] == "0.001667"


def test_an_owner_sets_the_spend_limit_and_concurrency_cap(owner):
    response = owner.client().patch(
        "/api/v1/billing/settings", {"monthly_spend_limit_usd": "25.50", "max_running_jobs": 2}, format="json"
    )
    assert response.status_code == 200, response.content
    assert (response.json()["spend_limit_usd"], response.json()["max_running_jobs"]) == ("25.50", 2)
    assert BillingAccount.objects.get(organization=owner.organization).monthly_spend_limit_micro_usd == 25_500_000
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs == 2
    assert AuditLogEntry.objects.filter(organization=owner.organization, action="billing.settings_update").count() == 1

    cleared = owner.client().patch("/api/v1/billing/settings", {"monthly_spend_limit_usd": None}, format="json").json()
    assert (cleared["spend_limit_usd"], cleared["max_running_jobs"]) == (None, 2)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"monthly_spend_limit_usd": "-1.00"}, "monthly_spend_limit_usd"),
        ({"monthly_spend_limit_usd": 25}, "monthly_spend_limit_usd"),
        ({"monthly_spend_limit_usd": "1.001"}, "monthly_spend_limit_usd"),
        ({"monthly_spend_limit_usd": "NaN"}, "monthly_spend_limit_usd"),
        ({"monthly_spend_limit_usd": "1e400"}, "monthly_spend_limit_usd"),
        ({"max_running_jobs": 0}, "max_running_jobs"),
        ({"max_running_jobs": 10_000}, "max_running_jobs"),
        ({"max_running_jobs": True}, "max_running_jobs"),
        ({"max_running_jobs": "2"}, "max_running_jobs"),
        ({"balance_usd": "1000000.00"}, "balance_usd"),
        ({"plan": "free"}, "plan"),
        ([1, 2], None),
    ],
)
def test_it_refuses_bad_settings_and_changes_nothing(owner, body, param):
    response = owner.client().patch("/api/v1/billing/settings", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param
    account = account_for(owner.organization.pk)
    assert (account.monthly_spend_limit_micro_usd, account.balance_micro_usd, account.plan) == (None, 10_000_000, "prepaid")
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs is None


def test_switching_plan_needs_billing_on(owner):
    response = owner.client().patch("/api/v1/billing/settings", {"plan": "invoiced"}, format="json")
    assert response.status_code == 409
    assert account_for(owner.organization.pk).plan == "prepaid"


def test_a_read_only_key_cannot_change_settings(owner):
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    response = owner.client(key).patch("/api/v1/billing/settings", {"monthly_spend_limit_usd": "1.00"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "insufficient_scope"
    assert account_for(owner.organization.pk).monthly_spend_limit_micro_usd is None
    assert owner.client(key).get("/api/v1/billing/balance").status_code == 200


def test_a_member_cannot_change_settings_through_the_service(owner, member):
    from billing.services import billing_settings_update
    from lab.api.errors import http_status
    from lab.errors import LabError

    with pytest.raises(LabError) as refused:
        billing_settings_update(actor=Actor(user=member), organization=owner.organization, data={"max_running_jobs": 1})
    assert http_status(refused.value) == 403
    with pytest.raises(LabError) as foreign:
        billing_settings_update(actor=Actor(user=member), organization=Organization.objects.create(slug="x", name="X"), data={})
    assert http_status(foreign.value) == 404
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs is None


def test_an_interval_is_recorded_once_even_if_closed_twice(owner):
    ended = timezone.now()
    record(owner, ended=ended)
    record(owner, ended=ended)
    assert UsageInterval.objects.for_project(owner.project).count() == 2  # 120 s = two 60 s intervals


def test_billing_answers_match_their_openapi_components(owner):
    from tests.support.schema_check import assert_matches, served_document

    document = served_document()
    record(owner, job_id="job_schema", seconds=90)
    client = owner.client()
    assert_matches(document, "Balance", client.get("/api/v1/billing/balance").json())
    assert_matches(document, "UsageRowList", client.get("/api/v1/usage?group_by=day,resource,job").json())
    assert_matches(document, "Balance", client.patch("/api/v1/billing/settings", {"max_running_jobs": 1}, format="json").json())
    operations = document["paths"]
    assert "404" in operations["/api/v1/usage"]["get"]["responses"]
    assert "402" in operations["/api/v1/jobs"]["post"]["responses"]
    assert "402" in operations["/api/v1/jobs/{job_id}/restart"]["post"]["responses"]
    assert set(operations["/api/v1/billing/settings"]) == {"patch"}
