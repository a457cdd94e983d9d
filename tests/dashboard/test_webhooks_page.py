"""The dashboard's webhooks pages: endpoints listed and created with the secret shown once,
enable/disable, rotate, test event, deliveries with request and response, redeliver.
Owners and admins change; members read; another organization's endpoint is a 404."""

from __future__ import annotations

import re

import pytest

from jobs.webhooks import outbox
from jobs.webhooks.delivery import deliver
from jobs.webhooks.endpoints import endpoint_create, endpoint_send_test
from jobs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from lab.audit import Actor
from lab.models import AuditLogEntry
from labsdk.webhooks import WebhookReceiver

pytestmark = pytest.mark.django_db

WEBHOOKS = "/o/acme/p/default/webhooks/"


@pytest.fixture(autouse=True)
def _webhook_settings(settings, monkeypatch):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    settings.LAB_WEBHOOK_RETRY_SCHEDULE = [0, 5, 300]
    # Deliveries run in the test (deliver), not on a worker.
    monkeypatch.setattr(outbox, "deliver_on_commit", lambda *args, **kwargs: None)


@pytest.fixture
def receiver():
    with WebhookReceiver() as running:
        yield running


def endpoint_of(tenant, url: str = "http://127.0.0.1:9/hook", events=None) -> WebhookEndpoint:
    data = {"url": url, **({"events": events} if events else {})}
    return endpoint_create(project=tenant.project, actor=Actor(user=tenant.user), data=data)


def secret_in(response) -> str:
    match = re.search(r'<code id="new-webhook-secret">(whsec_[^<]+)</code>', response.content.decode())
    assert match, "no secret on the page"
    return match.group(1)


def test_an_owner_creates_an_endpoint_and_sees_its_secret_once(owner, owner_client):
    response = owner_client.post(
        WEBHOOKS, {"url": "http://127.0.0.1:8123/hook", "events": ["job.succeeded", "checkpoint.ready"]}
    )
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    endpoint = WebhookEndpoint.objects.unscoped().get()
    assert secret_in(response) == endpoint.secret
    assert endpoint.url == "http://127.0.0.1:8123/hook"
    assert endpoint.events == ["job.succeeded", "checkpoint.ready"]
    assert endpoint.project == owner.project
    reloaded = owner_client.get(WEBHOOKS).content.decode()
    assert endpoint.secret not in reloaded
    assert "http://127.0.0.1:8123/hook" in reloaded
    assert AuditLogEntry.objects.filter(action="webhook_endpoint.create", actor_user=owner.user).count() == 1


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"url": "ftp://127.0.0.1/hook", "events": ["job.failed"]}, "url"),
        ({"url": "", "events": ["job.failed"]}, "url"),
        ({"url": "http://127.0.0.1/hook", "events": ["job.exploded"]}, "events"),
        ({"url": "http://127.0.0.1/hook"}, "events"),
        ({"url": "javascript:alert(1)//<script>", "events": ["job.failed"]}, "url"),
        ({"url": "http://" + "a" * 3000 + ".test/", "events": ["job.failed"]}, "url"),
    ],
)
def test_a_bad_endpoint_is_refused_next_to_its_field_and_nothing_is_created(owner_client, data, field):
    response = owner_client.post(WEBHOOKS, data)
    assert response.status_code == 200
    assert field in response.context["form"].errors
    assert "<script>" not in response.content.decode()
    assert 'id="new-webhook-secret"' not in response.content.decode()
    assert WebhookEndpoint.objects.unscoped().count() == 0


def test_a_private_address_is_refused_unless_allowed(owner_client, settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = False
    response = owner_client.post(WEBHOOKS, {"url": "http://10.1.2.3/hook", "events": ["job.failed"]})
    assert "LAB_WEBHOOK_ALLOW_PRIVATE" in " ".join(response.context["form"].errors["url"])
    assert WebhookEndpoint.objects.unscoped().count() == 0


def test_members_read_but_do_not_change(owner, member_client):
    endpoint = endpoint_of(owner)
    delivery = endpoint_send_test(endpoint=endpoint, actor=Actor(user=owner.user))
    listing = member_client.get(WEBHOOKS)
    assert listing.status_code == 200
    assert listing.context["form"] is None
    assert endpoint.secret not in listing.content.decode()
    detail = member_client.get(f"{WEBHOOKS}{endpoint.public_id}/")
    assert detail.status_code == 200
    assert "Redeliver" not in detail.content.decode()
    base = f"{WEBHOOKS}{endpoint.public_id}/"
    for url, data in [
        (WEBHOOKS, {"url": "http://127.0.0.1/x", "events": ["job.failed"]}),
        (base + "enabled/", {"enabled": "false"}),
        (base + "rotate/", {}),
        (base + "test/", {}),
        (base + "delete/", {}),
        (base + f"deliveries/{delivery.public_id}/redeliver/", {}),
    ]:
        assert member_client.post(url, data).status_code == 403, url
    assert member_client.get(base + "delete/").status_code == 403
    after = WebhookEndpoint.objects.unscoped().get()
    assert (after.enabled, after.secret, WebhookDelivery.objects.count()) == (True, endpoint.secret, 1)


def test_an_owner_disables_and_enables_an_endpoint(owner, owner_client):
    endpoint = endpoint_of(owner)
    base = f"{WEBHOOKS}{endpoint.public_id}/"
    assert owner_client.post(base + "enabled/", {"enabled": "false"}).status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.disabled_reason) == (False, "disabled_by_user")
    refused = owner_client.post(base + "test/", follow=True)
    assert "This endpoint is disabled" in refused.content.decode()
    assert WebhookDelivery.objects.count() == 0
    owner_client.post(base + "enabled/", {"enabled": "true"})
    endpoint.refresh_from_db()
    assert endpoint.enabled is True
    nonsense = owner_client.post(base + "enabled/", {"enabled": "maybe"}, follow=True)
    assert "Choose to enable or to disable" in nonsense.content.decode()
    endpoint.refresh_from_db()
    assert endpoint.enabled is True


def test_rotating_shows_the_new_secret_once(owner, owner_client):
    endpoint = endpoint_of(owner)
    old = endpoint.secret
    response = owner_client.post(f"{WEBHOOKS}{endpoint.public_id}/rotate/")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    endpoint.refresh_from_db()
    assert secret_in(response) == endpoint.secret != old
    assert endpoint.previous_secret == old
    assert endpoint.secret not in owner_client.get(f"{WEBHOOKS}{endpoint.public_id}/").content.decode()


def test_a_test_event_is_delivered_and_its_request_and_response_are_shown(owner, owner_client, receiver):
    endpoint = endpoint_of(owner, receiver.url("/hook"))
    receiver.expect("/hook", endpoint.secret, answers=[(500, 0.0)])
    response = owner_client.post(f"{WEBHOOKS}{endpoint.public_id}/test/", follow=True)
    assert "Sent a test event" in response.content.decode()
    delivery = WebhookDelivery.objects.get()
    deliver([delivery.pk])
    failed = owner_client.get(f"{WEBHOOKS}{endpoint.public_id}/").content.decode()
    assert "HTTP 500" in failed
    assert "&quot;ok&quot;: false" in failed  # the receiver's answer, indented
    assert "webhook.test" in failed and "This is a test event from Lab." in failed
    assert "webhook-signature" in failed

    owner_client.post(f"{WEBHOOKS}{endpoint.public_id}/deliveries/{delivery.public_id}/redeliver/")
    deliver([delivery.pk])
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.SUCCEEDED
    arrivals = receiver.at("/hook")
    assert len(arrivals) == 2 and all(arrival.verified for arrival in arrivals)
    assert arrivals[0].webhook_id == arrivals[1].webhook_id == delivery.public_id
    page = owner_client.get(f"{WEBHOOKS}{endpoint.public_id}/?status=succeeded")
    assert [item.public_id for item, _ in page.context["deliveries"]] == [delivery.public_id]
    assert "HTTP 200" in page.content.decode() and "&quot;ok&quot;: true" in page.content.decode()
    assert owner_client.get(f"{WEBHOOKS}{endpoint.public_id}/?status=failed").context["deliveries"] == []


def test_deleting_asks_first(owner, owner_client):
    endpoint = endpoint_of(owner)
    assert owner_client.get(f"{WEBHOOKS}{endpoint.public_id}/delete/").status_code == 200
    assert WebhookEndpoint.objects.unscoped().count() == 1
    assert owner_client.post(f"{WEBHOOKS}{endpoint.public_id}/delete/").status_code == 302
    assert WebhookEndpoint.objects.unscoped().count() == 0


def test_another_organizations_endpoint_and_delivery_are_404s(owner, outsider, owner_client, outsider_client):
    foreign = endpoint_of(outsider)
    foreign_delivery = endpoint_send_test(endpoint=foreign, actor=Actor(user=outsider.user))
    mine = endpoint_of(owner)
    for client, base in (
        (owner_client, f"{WEBHOOKS}{foreign.public_id}/"),
        (outsider_client, f"{WEBHOOKS}{mine.public_id}/"),
    ):
        assert client.get(base).status_code == 404
        assert client.get(base + "delete/").status_code == 404
        for rest in ("enabled/", "rotate/", "test/", "delete/"):
            assert client.post(base + rest, {"enabled": "false"}).status_code == 404
    assert (
        owner_client.post(f"{WEBHOOKS}{mine.public_id}/deliveries/{foreign_delivery.public_id}/redeliver/").status_code
        == 404
    )
    assert outsider_client.get(WEBHOOKS).status_code == 404
    assert outsider_client.post(WEBHOOKS, {"url": "http://127.0.0.1/x", "events": ["job.failed"]}).status_code == 404
    foreign_after, mine_after = WebhookEndpoint.objects.unscoped().get(pk=foreign.pk), WebhookEndpoint.objects.unscoped().get(pk=mine.pk)
    assert (foreign_after.enabled, foreign_after.secret) == (True, foreign.secret)
    assert (mine_after.enabled, mine_after.secret) == (True, mine.secret)
    assert WebhookEndpoint.objects.unscoped().count() == 2
    assert WebhookDelivery.objects.count() == 1
