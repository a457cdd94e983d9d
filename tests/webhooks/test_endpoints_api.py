"""The webhook endpoint REST API (docs/api.md): shapes, validation, tenancy."""

from __future__ import annotations

import ipaddress
import json

import pytest

from jobs.webhooks.models import WebhookDelivery, WebhookEndpoint
from jobs.webhooks.events import WEBHOOK_EVENT_TYPES

pytestmark = pytest.mark.django_db

BASE = "/api/v1/webhook-endpoints"
#: How this Python writes ::ffff:169.254.169.254 (3.13 keeps the dotted form, older ones do not).
MAPPED_METADATA = ipaddress.ip_address("::ffff:169.254.169.254")


def create(tenant, **body):
    body.setdefault("url", "https://93.184.215.14/hooks/lab")
    response = tenant.client().post(BASE, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_it_creates_an_endpoint_and_shows_the_secret_once(owner):
    body = create(owner, events=["job.succeeded", "checkpoint.ready"])
    endpoint = WebhookEndpoint.objects.unscoped().get()
    assert body == {
        "id": endpoint.public_id,
        "object": "webhook_endpoint",
        "url": "https://93.184.215.14/hooks/lab",
        "events": ["job.succeeded", "checkpoint.ready"],
        "enabled": True,
        "created_at": body["created_at"],
        "secret": endpoint.secret,
    }
    assert body["id"].startswith("whep_")
    assert body["secret"].startswith("whsec_") and len(body["secret"]) == 38
    assert body["created_at"].endswith("Z")
    assert endpoint.project == owner.project
    shown = owner.client().get(f"{BASE}/{endpoint.public_id}").json()
    assert "secret" not in shown
    listed = owner.client().get(BASE).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    assert [item["id"] for item in listed["data"]] == [endpoint.public_id]
    assert "secret" not in listed["data"][0]


def test_it_subscribes_to_every_event_type_by_default(owner):
    assert create(owner)["events"] == list(WEBHOOK_EVENT_TYPES)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"url": "ftp://example.com/hook"}, "url", "unsupported_scheme"),
        ({"url": "https://example.com/" + "a" * 2050}, "url", "url_too_long"),
        ({"url": "http://127.0.0.1:9000/hook"}, "url", "private_address"),
        ({"url": "http://169.254.169.254/latest"}, "url", "blocked_address"),
        ({}, "url", "required"),
        ({"url": 5}, "url", "invalid_url"),
        ({"url": "https://93.184.215.14/", "events": ["job.queued", "job.exploded"]}, "events.1", "unknown_event_type"),
        ({"url": "https://93.184.215.14/", "events": []}, "events", "invalid"),
        ({"url": "https://93.184.215.14/", "enabled": "yes"}, "enabled", "invalid"),
        ({"url": "https://93.184.215.14/", "secret": "whsec_mine"}, "secret", "unknown_field"),
    ],
)
def test_it_refuses_bad_input_with_the_field_named(owner, settings, body, param, code):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = False
    response = owner.client().post(BASE, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["param"] == param
    assert error["errors"][0]["code"] == code
    assert not WebhookEndpoint.objects.unscoped().exists()


def test_it_accepts_a_loopback_url_when_private_addresses_are_allowed(owner, settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    assert create(owner, url="http://127.0.0.1:9000/hook")["url"] == "http://127.0.0.1:9000/hook"


def test_it_updates_url_events_and_enabled(owner):
    endpoint_id = create(owner)["id"]
    response = owner.client().patch(
        f"{BASE}/{endpoint_id}",
        {"url": "https://93.184.215.15/new", "events": ["job.failed", "job.failed"], "enabled": False},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["url"], body["events"], body["enabled"]) == ("https://93.184.215.15/new", ["job.failed"], False)
    assert "secret" not in body
    refused = owner.client().patch(f"{BASE}/{endpoint_id}", {"events": ["nope"]}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "events.0"
    assert WebhookEndpoint.objects.unscoped().get().events == ["job.failed"]


def test_it_rotates_the_secret(owner):
    created = create(owner)
    response = owner.client().post(f"{BASE}/{created['id']}/rotate-secret")
    assert response.status_code == 200
    rotated = response.json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != created["secret"]
    endpoint = WebhookEndpoint.objects.unscoped().get()
    assert endpoint.secret == rotated["secret"] and endpoint.previous_secret == created["secret"]


def test_it_deletes_an_endpoint_with_its_deliveries(owner):
    endpoint_id = create(owner)["id"]
    owner.client().post(f"{BASE}/{endpoint_id}/test")
    assert owner.client().delete(f"{BASE}/{endpoint_id}").status_code == 204
    assert not WebhookEndpoint.objects.unscoped().exists() and not WebhookDelivery.objects.exists()
    assert owner.client().get(f"{BASE}/{endpoint_id}").status_code == 404


def test_it_queues_a_test_event_and_lists_it_with_redeliver(owner):
    endpoint_id = create(owner)["id"]
    response = owner.client().post(f"{BASE}/{endpoint_id}/test")
    assert response.status_code == 202, response.content
    delivery = response.json()
    assert delivery["id"].startswith("msg_")
    assert delivery["event_type"] == "webhook.test"
    assert delivery["status"] == "pending" and delivery["attempts"] == []
    listed = owner.client().get(f"{BASE}/{endpoint_id}/deliveries").json()
    assert [item["id"] for item in listed["data"]] == [delivery["id"]]
    assert owner.client().get(f"{BASE}/{endpoint_id}/deliveries?status=bogus").status_code == 400
    again = owner.client().post(f"{BASE}/{endpoint_id}/deliveries/{delivery['id']}/redeliver")
    assert again.status_code == 202 and again.json()["id"] == delivery["id"]


def test_a_disabled_endpoint_refuses_test_events(owner):
    endpoint_id = create(owner, enabled=False)["id"]
    response = owner.client().post(f"{BASE}/{endpoint_id}/test")
    assert response.status_code == 409 and response.json()["error"]["code"] == "invalid_state"
    assert not WebhookDelivery.objects.exists()


def test_a_read_only_key_cannot_create_endpoints(owner):
    from lab.audit import Actor
    from lab.services import api_key_create

    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    response = owner.client(read_key).post(BASE, {"url": "https://93.184.215.14/"}, format="json")
    assert response.status_code == 403
    assert not WebhookEndpoint.objects.unscoped().exists()


def test_an_outsider_gets_404_for_every_webhook_endpoint_and_changes_nothing(owner, outsider):
    created = create(owner, events=["job.queued"])
    endpoint_id = created["id"]
    delivery_id = owner.client().post(f"{BASE}/{endpoint_id}/test").json()["id"]
    client = outsider.client()
    calls = [
        ("get", f"{BASE}/{endpoint_id}", None),
        ("patch", f"{BASE}/{endpoint_id}", {"enabled": False, "url": "https://93.184.215.99/"}),
        ("delete", f"{BASE}/{endpoint_id}", None),
        ("post", f"{BASE}/{endpoint_id}/rotate-secret", None),
        ("post", f"{BASE}/{endpoint_id}/test", None),
        ("get", f"{BASE}/{endpoint_id}/deliveries", None),
        ("post", f"{BASE}/{endpoint_id}/deliveries/{delivery_id}/redeliver", None),
    ]
    for method, path, body in calls:
        response = getattr(client, method)(path, body, format="json") if body else getattr(client, method)(path)
        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert client.get(BASE).json()["data"] == []
    endpoint = WebhookEndpoint.objects.unscoped().get()
    assert (endpoint.url, endpoint.enabled, endpoint.secret) == (created["url"], True, created["secret"])
    assert WebhookDelivery.objects.count() == 1


def test_a_delivery_of_another_endpoint_is_not_found_under_this_one(owner):
    first = create(owner)["id"]
    second = create(owner)["id"]
    delivery_id = owner.client().post(f"{BASE}/{first}/test").json()["id"]
    response = owner.client().post(f"{BASE}/{second}/deliveries/{delivery_id}/redeliver")
    assert response.status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        [],
        "https://93.184.215.14/",
        {"url": ["https://93.184.215.14/"]},
        {"url": "http://[::1"},
        {"url": "http://ü.invalid/hook"},
        {"url": "http://a..b/hook"},
        {"url": "http://example.com:0/"},
        {"url": "https://93.184.215.14/\x00"},
        {"url": "https://93.184.215.14/\ud800"},
        {"url": "https://93.184.215.14/", "events": {"job.queued": True}},
        {"url": "https://93.184.215.14/", "events": [["job.queued"]]},
        {"url": "https://93.184.215.14/", "events": ["job.queued"] * 10_000},
        {"url": "https://93.184.215.14/", "enabled": None},
        {"url": "https://93.184.215.14/", "\ud800": 1},
    ],
)
def test_hostile_bodies_are_refused_or_accepted_never_5xx(owner, body):
    import json as json_module

    content = json_module.dumps(body)
    response = owner.client().generic("POST", BASE, content, content_type="application/json")
    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        assert not WebhookEndpoint.objects.unscoped().exists()


def test_an_idempotent_replay_of_a_create_answers_without_the_secret_and_stores_none(owner):
    from lab.models import IdempotencyRecord

    client = owner.client()
    body = {"url": "https://93.184.215.14/hooks/lab", "events": ["job.failed"]}
    first = client.post(BASE, body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    replay = client.post(BASE, body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    endpoint = WebhookEndpoint.objects.unscoped().get()
    assert first.status_code == 201
    assert first.json()["secret"] == endpoint.secret
    assert replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true"
    shown = owner.client().get(f"{BASE}/{endpoint.public_id}").json()
    assert replay.json() == shown
    assert "secret" not in replay.json()
    record = IdempotencyRecord.objects.get(project=owner.project, key="create-1")
    assert record.status_code == 201
    assert record.response_body == shown
    assert endpoint.secret not in json.dumps(record.response_body)


def test_an_idempotent_replay_of_a_rotation_answers_without_the_secret_and_stores_none(owner):
    from lab.models import IdempotencyRecord

    created = create(owner)
    client = owner.client()
    first = client.post(f"{BASE}/{created['id']}/rotate-secret", HTTP_IDEMPOTENCY_KEY="rotate-1")
    replay = client.post(f"{BASE}/{created['id']}/rotate-secret", HTTP_IDEMPOTENCY_KEY="rotate-1")
    endpoint = WebhookEndpoint.objects.unscoped().get()
    assert first.status_code == 200
    assert first.json()["secret"] == endpoint.secret
    assert endpoint.previous_secret == created["secret"]
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json() == owner.client().get(f"{BASE}/{endpoint.public_id}").json()
    record = IdempotencyRecord.objects.get(project=owner.project, key="rotate-1")
    assert "secret" not in record.response_body
    stored = json.dumps(record.response_body)
    assert endpoint.secret not in stored and created["secret"] not in stored


@pytest.mark.parametrize("allow_private", [True, False])
@pytest.mark.parametrize(
    ("url", "code", "message"),
    [
        ("http://\u2460\u2461\u2466.0.0.1/", "invalid_url", "The URL's host is not a valid host name (IDNA 2008)."),
        ("http://169.254.169.254.:80/", "invalid_url", "The URL's host may not end with a dot."),
        ("https://hooks.example.com./lab", "invalid_url", "The URL's host may not end with a dot."),
        (
            "http://[2002:a9fe:a9fe::]/",
            "blocked_address",
            "2002:a9fe:a9fe:: resolves to a refused address (2002:a9fe:a9fe::, which carries 169.254.169.254).",
        ),
        (
            "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",
            "blocked_address",
            "2001:0:4136:e378:8000:63bf:5601:5601 resolves to a refused address "
            "(2001:0:4136:e378:8000:63bf:5601:5601, which carries 65.54.227.120, 169.254.169.254).",
        ),
        (
            "http://[::ffff:169.254.169.254]/",
            "blocked_address",
            f"::ffff:169.254.169.254 resolves to a refused address ({MAPPED_METADATA}, which carries 169.254.169.254).",
        ),
    ],
)
def test_it_refuses_urls_that_could_never_be_sent_and_creates_nothing(owner, settings, allow_private, url, code, message):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = allow_private
    response = owner.client().post(BASE, {"url": url}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"], error["message"]) == ("invalid_request", "url", message)
    assert error["errors"] == [{"param": "url", "code": code, "message": message}]
    assert not WebhookEndpoint.objects.unscoped().exists()


def test_it_refuses_a_6to4_form_of_a_loopback_address_unless_private_addresses_are_allowed(owner, settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = False
    response = owner.client().post(BASE, {"url": "http://[2002:7f00:1::]/hook"}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["errors"][0]["code"] == "private_address"
    assert not WebhookEndpoint.objects.unscoped().exists()


def test_it_refuses_a_url_change_to_a_trailing_dot_host_and_keeps_the_old_url(owner):
    endpoint_id = create(owner)["id"]
    response = owner.client().patch(f"{BASE}/{endpoint_id}", {"url": "http://169.254.169.254.:80/"}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["errors"][0]["code"] == "invalid_url"
    assert WebhookEndpoint.objects.unscoped().get().url == "https://93.184.215.14/hooks/lab"
