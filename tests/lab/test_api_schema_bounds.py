"""The OpenAPI document states the bounds the API checks: ``amount_usd`` of a Checkout (5.00 to
10000.00), ``max_running_jobs`` (1 to ``LAB_ORG_MAX_RUNNING_JOBS``) and ``monthly_spend_limit_usd``
of the billing settings, a webhook endpoint's ``url`` (no host of numbers alone, such as ``0``)
and the query of ``GET /usage`` (dates, ``group_by``). The document said any MONEY string, any
integer from 1, any string, so schema-valid requests (``"0.0"``, ``4555``, ``http://0``,
``start=0``) were refused with 400.

Each case is one value sent to the API and checked against the document: whether the document
takes it and the answer's status are both asserted, so that nothing the document takes is
refused with 400.
"""

from __future__ import annotations

import copy

import pytest
from jsonschema import Draft202012Validator

from jobs.webhooks.models import WebhookEndpoint
from tests.support.schema_check import served_document

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def document(django_db_blocker) -> dict:
    with django_db_blocker.unblock():
        return served_document()


def schema_takes(document: dict, schema: dict, value) -> bool:
    """Return whether ``value`` is valid for ``schema`` (refs into ``document``'s components, formats checked)."""
    root = copy.deepcopy(schema) | {"components": document["components"]}
    return Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER).is_valid(value)


def body_schema(document: dict, path: str, method: str) -> dict:
    return document["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def query_schema(document: dict, path: str, name: str) -> dict:
    [parameter] = [p for p in document["paths"][path]["get"]["parameters"] if p["name"] == name]
    return parameter["schema"]


# Without STRIPE_API_KEY a Checkout the API takes is 409 (billing is off), after the amount is checked.
@pytest.mark.parametrize(("amount", "taken", "status"), [
    ("0.0", False, 400), ("4.99", False, 400), ("5", True, 409), ("5.00", True, 409), ("25.5", True, 409),
    ("9999.99", True, 409), ("10000", True, 409), ("10000.00", True, 409), ("10000.01", False, 400),
    ("5.001", False, 400), ("-5.00", False, 400),
    ("1e3", False, 409),  # Decimal reads it as 1000: taken by the API, not written so by the document
])
def test_a_checkout_amount_is_taken_by_the_document_as_by_the_api(document, owner, amount, taken, status):
    schema = body_schema(document, "/api/v1/billing/checkout", "post")

    response = owner.client().post("/api/v1/billing/checkout", {"amount_usd": amount}, format="json")

    assert (schema_takes(document, schema, {"amount_usd": amount}), response.status_code) == (taken, status)


def test_a_checkout_body_with_another_field_is_refused_by_both(document, owner):
    body = {"amount_usd": "25.00", "note": "x"}
    response = owner.client().post("/api/v1/billing/checkout", body, format="json")

    assert (schema_takes(document, body_schema(document, "/api/v1/billing/checkout", "post"), body),
            response.status_code) == (False, 400)


@pytest.mark.parametrize(("body", "taken", "status"), [
    ({"max_running_jobs": 0}, False, 400),
    ({"max_running_jobs": 1}, True, 200),
    ({"max_running_jobs": 4}, True, 200),
    ({"max_running_jobs": 5}, False, 400),
    ({"max_running_jobs": 4555}, False, 400),
    ({"max_running_jobs": None}, True, 200),
    ({"monthly_spend_limit_usd": "0"}, True, 200),
    ({"monthly_spend_limit_usd": "0.00"}, True, 200),
    ({"monthly_spend_limit_usd": "125.5"}, True, 200),
    ({"monthly_spend_limit_usd": "10000000.00"}, True, 200),
    ({"monthly_spend_limit_usd": "10000000.01"}, False, 400),
    ({"monthly_spend_limit_usd": "55998633.04641"}, False, 400),
    ({"monthly_spend_limit_usd": "1.234"}, False, 400),
    ({"monthly_spend_limit_usd": "-1.00"}, False, 400),
])
def test_billing_settings_are_taken_by_the_document_as_by_the_api(document, owner, settings, body, taken, status):
    assert settings.LAB_ORG_MAX_RUNNING_JOBS == 4
    schema = body_schema(document, "/api/v1/billing/settings", "patch")

    response = owner.client().patch("/api/v1/billing/settings", body, format="json")

    assert (schema_takes(document, schema, body), response.status_code) == (taken, status)


@pytest.mark.parametrize(("url", "taken", "status"), [
    ("http://0", False, 400),
    ("http://0.0.0.0", False, 400),
    ("http://0:8080/hook", False, 400),
    ("http://2130706433/", False, 400),
    ("http://0x7f.1", False, 400),
    ("https://93.184.215.14/hook", True, 201),
    ("https://93.184.215.14:8443", True, 201),
    ("https://hooks.example.invalid/lab?team=1", True, 201),
])
def test_a_webhook_url_is_taken_by_the_document_as_by_the_api(document, owner, settings, url, taken, status):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = False
    schema = body_schema(document, "/api/v1/webhook-endpoints", "post")

    response = owner.client().post("/api/v1/webhook-endpoints", {"url": url}, format="json")

    assert (schema_takes(document, schema, {"url": url}), response.status_code) == (taken, status)
    assert WebhookEndpoint.objects.unscoped().count() == (1 if status == 201 else 0)
    update = body_schema(document, "/api/v1/webhook-endpoints/{endpoint_id}", "patch")
    assert schema_takes(document, update, {"url": url}) is taken


@pytest.mark.parametrize(("query", "taken", "status"), [
    ({"start": "2026-11-01"}, True, 200),
    ({"start": "2026-11-01T08:30:00Z", "end": "2026-11-02T00:00:00.125+05:30"}, True, 200),
    ({"start": "0"}, False, 400),
    ({"start": "2026-02-30"}, False, 400),
    ({"end": "0001-01-01T00:00:00+05:00"}, False, 400),
    ({"start": "next tuesday"}, False, 400),
    ({"group_by": "day"}, True, 200),
    ({"group_by": "job,resource,day"}, True, 200),
    ({"group_by": "day,day"}, False, 400),
    ({"group_by": "week"}, False, 400),
    ({"group_by": "day,"}, False, 400),
])
def test_a_usage_query_is_taken_by_the_document_as_by_the_api(document, owner, query, taken, status):
    response = owner.client().get("/api/v1/usage", query)

    assert (all(schema_takes(document, query_schema(document, "/api/v1/usage", name), value)
                for name, value in query.items()), response.status_code) == (taken, status)
