"""The webhook endpoint bodies in the OpenAPI document (jobs/webhooks/openapi.py): real answers
match their components, and only create and rotate document (and show) the secret."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.webhooks.models import WebhookAttempt, WebhookDelivery
from tests.support.schema_check import assert_matches, served_document

pytestmark = pytest.mark.django_db

BASE = "/api/v1/webhook-endpoints"


@pytest.fixture
def document() -> dict:
    return served_document()


def test_only_create_and_rotate_answers_document_the_secret(document):
    components = document["components"]["schemas"]
    assert "secret" not in components["WebhookEndpoint"]["properties"]
    assert "secret" in components["WebhookEndpointWithSecret"]["properties"]
    with_secret = {"$ref": "#/components/schemas/WebhookEndpointWithSecret"}
    documented = {
        (method, path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for answer in operation["responses"].values()
        if answer.get("content", {}).get("application/json", {}).get("schema") == with_secret
    }
    assert documented == {("post", BASE), ("post", BASE + "/{endpoint_id}/rotate-secret")}


def test_endpoint_answers_match_their_components_and_only_create_and_rotate_show_the_secret(document, owner):
    client = owner.client()
    created = client.post(BASE, {"url": "https://93.184.215.14/hooks"}, format="json").json()
    endpoint = f"{BASE}/{created['id']}"
    assert created["secret"].startswith("whsec_")
    assert_matches(document, "WebhookEndpointWithSecret", created)
    assert_matches(document, "WebhookEndpoint", client.get(endpoint).json())
    assert_matches(document, "WebhookEndpointList", client.get(BASE).json())
    assert_matches(document, "WebhookEndpoint", client.patch(endpoint, {"enabled": True}, format="json").json())
    rotated = client.post(f"{endpoint}/rotate-secret").json()
    assert rotated["secret"] != created["secret"]
    assert_matches(document, "WebhookEndpointWithSecret", rotated)
    with pytest.raises(AssertionError):
        assert_matches(document, "WebhookEndpoint", rotated)


def test_delivery_answers_match_their_components(document, owner):
    client = owner.client()
    endpoint = f"{BASE}/" + client.post(BASE, {"url": "https://93.184.215.14/hooks"}, format="json").json()["id"]
    delivery = client.post(f"{endpoint}/test").json()
    assert_matches(document, "WebhookDelivery", delivery)
    row = WebhookDelivery.objects.get(public_id=delivery["id"])
    WebhookAttempt.objects.create(
        delivery=row,
        number=1,
        started_at=timezone.now() - timedelta(seconds=1),
        duration_ms=12,
        status_code=500,
        error="HTTP 500",
        response_excerpt="oops",
        request_headers={"webhook-id": delivery["event_id"]},
    )
    WebhookAttempt.objects.create(delivery=row, number=2, started_at=timezone.now(), error="connection refused")

    deliveries = client.get(f"{endpoint}/deliveries").json()
    redelivered = client.post(f"{endpoint}/deliveries/{delivery['id']}/redeliver").json()

    assert [len(item["attempts"]) for item in deliveries["data"]] == [2]
    assert_matches(document, "WebhookDeliveryList", deliveries)
    assert_matches(document, "WebhookDelivery", redelivered)
