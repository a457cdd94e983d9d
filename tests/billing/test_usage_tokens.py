"""GET /usage with served tokens: per deployment, beside compute, each request once, outsiders 404."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.tokens import token_usage_record
from tests.support.billing import record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("default_prices")]


def served(tenant, *, request_id, deployment_id="dep_a", prompt=1000, completion=2000, when=None):
    """Record one request of ``tenant``'s deployment at the default token price ($0.10 / $0.30 per million)."""
    return token_usage_record(
        organization_id=tenant.organization.pk, project_id=tenant.project.pk, request_id=request_id,
        deployment_public_id=deployment_id, model="tiny", prompt_tokens=prompt, completion_tokens=completion, now=when,
    )


def test_it_sums_tokens_per_deployment_beside_compute(owner):
    yesterday = (timezone.now() - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    record(owner, job_id="job_a", seconds=3600, ended=yesterday)  # one CPU hour: $0.10
    served(owner, request_id="req_1", when=yesterday)  # 1000 × 0.10 + 2000 × 0.30 micro-dollars: $0.0007
    served(owner, request_id="req_2", prompt=10, completion=20, when=yesterday)
    served(owner, request_id="req_3", deployment_id="dep_b", prompt=1_000_000, completion=0, when=yesterday)
    served(owner, request_id="req_1", prompt=99, when=yesterday)  # the same request again: recorded once
    client = owner.client()
    start = (yesterday - timedelta(days=1)).date().isoformat()

    by_deployment = client.get(f"/api/v1/usage?start={start}&group_by=deployment").json()["data"]
    assert by_deployment == [
        {"deployment_id": "dep_a", "gpu_seconds": 0.0, "cpu_seconds": 0.0, "memory_gb_seconds": 0.0, "requests": 2, "prompt_tokens": 1010,
         "completion_tokens": 2020, "cost_usd": "0.000707"},
        {"deployment_id": "dep_b", "gpu_seconds": 0.0, "cpu_seconds": 0.0, "memory_gb_seconds": 0.0, "requests": 1, "prompt_tokens": 1_000_000,
         "completion_tokens": 0, "cost_usd": "0.10"},
        {"deployment_id": None, "gpu_seconds": 0.0, "cpu_seconds": 3600.0, "memory_gb_seconds": 0.0, "requests": 0, "prompt_tokens": 0,
         "completion_tokens": 0, "cost_usd": "0.10"},
    ]
    by_day = client.get(f"/api/v1/usage?start={start}&group_by=day").json()["data"]
    assert [(row["date"], row["requests"], row["cpu_seconds"], row["cost_usd"]) for row in by_day] == [
        (yesterday.date().isoformat(), 3, 3600.0, "0.200707"),
    ]
    by_resource = client.get(f"/api/v1/usage?start={start}&group_by=resource,job").json()["data"]
    assert [(row["resource"], row["job_id"], row["requests"]) for row in by_resource] == [("cpu", "job_a", 0), ("tokens", None, 3)]
    only_a = client.get(f"/api/v1/usage?start={start}&group_by=day&deployment_id=dep_a").json()["data"]
    assert [(row["requests"], row["cpu_seconds"], row["cost_usd"]) for row in only_a] == [(2, 0.0, "0.000707")]
    only_job = client.get(f"/api/v1/usage?start={start}&group_by=day&job_id=job_a").json()["data"]
    assert [(row["requests"], row["cpu_seconds"]) for row in only_job] == [(0, 3600.0)]


def test_an_outsider_gets_404_for_a_deployment_of_another_organization(owner, outsider):
    served(owner, request_id="req_acme", deployment_id="dep_acme")
    response = outsider.client().get("/api/v1/usage?deployment_id=dep_acme")
    assert response.status_code == 404
    assert response.json() == owner.client().get("/api/v1/usage?deployment_id=dep_missing").json()
    assert outsider.client().get("/api/v1/usage?group_by=deployment").json()["data"] == []
    assert owner.client().get("/api/v1/usage?deployment_id=dep_acme").json()["data"][0]["requests"] == 1


def test_it_refuses_an_overlong_deployment_id_as_missing(owner):
    response = owner.client().get("/api/v1/usage?deployment_id=" + "d" * 500)
    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")
