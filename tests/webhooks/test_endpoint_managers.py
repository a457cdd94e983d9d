"""Who may change webhook endpoints: owners, admins, the project's write keys and Lab itself,
whoever calls the services (API, dashboard or code); everyone else is refused and nothing changes."""

from __future__ import annotations

import pytest

from jobs.webhooks.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_rotate_secret,
    endpoint_send_test,
    endpoint_update,
)
from jobs.webhooks.models import WebhookDelivery, WebhookEndpoint
from lab.api.errors import http_status, lab_error_body
from lab.audit import Actor
from lab.errors import LabError
from lab.models import AuditLogEntry, Membership, Role
from lab.services import api_key_create, user_sign_up
from tests.conftest import PASSWORD
from tests.support.dashboard import signed_in

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:9/hook"
MEMBER_MESSAGE = "Only organization owners and admins may change webhook endpoints."


@pytest.fixture
def admin(owner):
    user = user_sign_up(email="admin@acme.test", password=PASSWORD)
    Membership.objects.create(organization=owner.organization, user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def endpoint(owner) -> WebhookEndpoint:
    return endpoint_create(project=owner.project, actor=Actor(user=owner.user), data={"url": URL})


def every_change(project, endpoint, delivery):
    """Each service that changes an endpoint or its deliveries, as a call taking the actor."""
    return {
        "create": lambda actor: endpoint_create(project=project, actor=actor, data={"url": "http://127.0.0.1:9/other"}),
        "update": lambda actor: endpoint_update(endpoint=endpoint, actor=actor, data={"enabled": False}),
        "rotate": lambda actor: endpoint_rotate_secret(endpoint=endpoint, actor=actor),
        "test": lambda actor: endpoint_send_test(endpoint=endpoint, actor=actor),
        "redeliver": lambda actor: delivery_redeliver(delivery=delivery, actor=actor),
        "delete": lambda actor: endpoint_delete(endpoint=endpoint, actor=actor),
    }


def assert_unchanged(endpoint: WebhookEndpoint, delivery: WebhookDelivery) -> None:
    after = WebhookEndpoint.objects.unscoped().get()
    assert (after.url, after.events, after.enabled, after.secret, after.previous_secret) == (
        endpoint.url,
        endpoint.events,
        True,
        endpoint.secret,
        "",
    )
    assert list(WebhookDelivery.objects.values_list("pk", "status", "attempt_count")) == [
        (delivery.pk, "pending", 0)
    ]


def test_a_member_calling_the_services_directly_is_refused_and_nothing_changes(owner, member, endpoint):
    delivery = endpoint_send_test(endpoint=endpoint, actor=Actor(user=owner.user))
    audit_rows = AuditLogEntry.objects.count()
    for name, change in every_change(owner.project, endpoint, delivery).items():
        with pytest.raises(LabError) as refused:
            change(Actor(user=member))
        assert lab_error_body(refused.value) == {
            "error": {
                "type": "permission_error",
                "code": "insufficient_scope",
                "message": MEMBER_MESSAGE,
                "param": None,
                "errors": [],
            }
        }, name
    assert_unchanged(endpoint, delivery)
    assert AuditLogEntry.objects.count() == audit_rows
    assert not AuditLogEntry.objects.filter(actor_user=member).exists()


def test_a_read_only_key_calling_the_services_directly_is_refused_and_nothing_changes(owner, endpoint):
    delivery = endpoint_send_test(endpoint=endpoint, actor=Actor(user=owner.user))
    read_key, _ = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    for name, change in every_change(owner.project, endpoint, delivery).items():
        with pytest.raises(LabError) as refused:
            change(Actor(api_key=read_key))
        assert (http_status(refused.value), refused.value.code, refused.value.message) == (
            403,
            "insufficient_scope",
            "This API key lacks the 'write' scope.",
        ), name
    assert_unchanged(endpoint, delivery)


def test_another_tenants_user_or_key_gets_not_found_and_nothing_changes(owner, outsider, endpoint):
    delivery = endpoint_send_test(endpoint=endpoint, actor=Actor(user=owner.user))
    for actor in (Actor(user=outsider.user), Actor(api_key=outsider.api_key)):
        for name, change in every_change(owner.project, endpoint, delivery).items():
            with pytest.raises(LabError) as refused:
                change(actor)
            assert (http_status(refused.value), refused.value.code) == (404, "not_found"), (actor, name)
    assert_unchanged(endpoint, delivery)


def test_an_admin_changes_endpoints_through_the_services(owner, admin):
    actor = Actor(user=admin)
    endpoint = endpoint_create(project=owner.project, actor=actor, data={"url": URL, "events": ["job.failed"]})
    delivery = endpoint_send_test(endpoint=endpoint, actor=actor)
    assert delivery_redeliver(delivery=delivery, actor=actor).status == "pending"
    rotated = endpoint_rotate_secret(endpoint=endpoint, actor=actor)
    assert rotated.previous_secret == endpoint.secret
    assert endpoint_update(endpoint=endpoint, actor=actor, data={"enabled": False}).enabled is False
    endpoint_delete(endpoint=endpoint, actor=actor)
    assert not WebhookEndpoint.objects.unscoped().exists()
    assert list(AuditLogEntry.objects.filter(actor_user=admin).order_by("pk").values_list("action", flat=True)) == [
        "webhook_endpoint.create",
        "webhook_endpoint.test",
        "webhook_delivery.redeliver",
        "webhook_endpoint.rotate_secret",
        "webhook_endpoint.update",
        "webhook_endpoint.delete",
    ]


def test_lab_itself_may_create_endpoints(owner):
    endpoint = endpoint_create(project=owner.project, actor=Actor.system(), data={"url": URL})
    assert WebhookEndpoint.objects.unscoped().get() == endpoint


def test_a_write_key_made_by_an_admin_manages_endpoints_until_its_creator_is_no_longer_an_admin(owner, admin):
    """A key acts for the owner or admin who made it (docs/api.md "API keys"): once they are a
    plain member it no longer authenticates, and what it asks changes nothing."""
    _, key = api_key_create(actor=Actor(user=admin), project=owner.project, name="ci")
    created = owner.client(key).post("/api/v1/webhook-endpoints", {"url": URL}, format="json")
    assert created.status_code == 201, created.content
    secret = WebhookEndpoint.objects.unscoped().get().secret
    Membership.objects.filter(user=admin).update(role=Role.MEMBER)
    rotated = owner.client(key).post(f"/api/v1/webhook-endpoints/{created.json()['id']}/rotate-secret")
    assert rotated.status_code == 401, rotated.content
    assert rotated.json()["error"]["code"] == "invalid_api_key"
    assert WebhookEndpoint.objects.unscoped().get().secret == secret


def test_the_dashboard_refuses_a_member_with_its_own_message_before_the_service_is_asked(owner, member):
    response = signed_in(member).post("/o/acme/p/default/webhooks/", {"url": URL, "events": ["job.failed"]})
    assert response.status_code == 403
    assert "Only organization owners and admins may do this." in response.content.decode()
    assert not WebhookEndpoint.objects.unscoped().exists()
