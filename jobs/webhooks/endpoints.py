"""Webhook endpoint services: create, change, rotate the secret, test, delete, redeliver.

Who may: owners and admins of the project's organization, the project's API keys with the
``write`` scope (keys are made by owners and admins only), and Lab itself; every service here
asks ``require_endpoint_manager`` first, so the API, the dashboard and any other caller apply
the same rule. Each runs in one transaction and writes an audit row (``lab.audit``).

Bodies are validated by ``jobs.webhooks.schemas``; a secret is ``whsec_<base64>`` (Standard
Webhooks), shown by the callers on create and rotate only.
"""

from __future__ import annotations

import base64
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.webhooks import outbox
from jobs.webhooks.events import TEST_EVENT_TYPE
from jobs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from jobs.webhooks.schemas import parse_endpoint_create, parse_endpoint_update
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import LabError, not_found
from lab.lib.http import mask_url
from lab.models import ApiKeyScope, Membership, Project

#: How long the previous secret keeps signing after a rotation.
PREVIOUS_SECRET_TTL = timedelta(hours=24)


def require_endpoint_manager(*, actor: Actor, project: Project) -> None:
    """Refuse an actor who may not change ``project``'s webhook endpoints and deliveries.

    Allowed: an owner or admin of the project's organization, an API key of the project with the
    ``write`` scope, and the system actor. Raises LabError ``insufficient_scope`` for a
    plain member or a read-only key, and 404 ``not_found`` for a user or key of another tenant
    (another tenant's objects are never a 403).
    """
    if actor.api_key is not None:
        if actor.api_key.project_id != project.pk:
            raise not_found("project")
        if ApiKeyScope.WRITE not in actor.api_key.scopes:
            raise LabError("insufficient_scope", f"This API key lacks the '{ApiKeyScope.WRITE}' scope.")
    if actor.user is not None:
        membership = Membership.objects.filter(user=actor.user, organization_id=project.organization_id).first()
        if membership is None:
            raise not_found("project")
        if not membership.can_manage:
            raise LabError(
                "insufficient_scope",
                "Only organization owners and admins may change webhook endpoints.",
            )


def new_secret() -> str:
    """Return a fresh ``whsec_<base64 of 24 random bytes>`` secret (Standard Webhooks format)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@transaction.atomic
def endpoint_create(*, project: Project, actor: Actor, data: Any) -> WebhookEndpoint:
    """Create an endpoint from a request body (``jobs.webhooks.schemas.EndpointCreate``) with a new secret.

    Raises LabError (``require_endpoint_manager``) or 400 ``invalid_request``.
    """
    require_endpoint_manager(actor=actor, project=project)
    fields = parse_endpoint_create(data, allow_private=settings.LAB_WEBHOOK_ALLOW_PRIVATE)
    endpoint = WebhookEndpoint.objects.create(
        project=project, secret=new_secret(), url=fields.url, events=fields.events, enabled=fields.enabled
    )
    _audit(
        actor,
        endpoint,
        AuditAction.WEBHOOK_ENDPOINT_CREATE,
        {"url": mask_url(endpoint.url), "events": endpoint.events},
    )
    return endpoint


@transaction.atomic
def endpoint_update(
    *, endpoint: WebhookEndpoint, actor: Actor, data: Any, now: datetime | None = None
) -> WebhookEndpoint:
    """Change ``url``, ``events`` and/or ``enabled`` (``jobs.webhooks.schemas.EndpointUpdate``).

    Enabling again forgets past failures; disabling records ``disabled_by_user``. Raises
    LabError (``require_endpoint_manager``) or 400 ``invalid_request``, changing nothing.
    """
    require_endpoint_manager(actor=actor, project=endpoint.project)
    fields = parse_endpoint_update(data, allow_private=settings.LAB_WEBHOOK_ALLOW_PRIVATE).changes()
    endpoint = WebhookEndpoint.objects.unscoped().select_for_update().get(pk=endpoint.pk)
    for name, value in fields.items():
        setattr(endpoint, name, value)
    if fields.get("enabled") is True:
        endpoint.failing_since = None
        endpoint.disabled_reason = ""
    elif fields.get("enabled") is False:
        endpoint.disabled_reason = "disabled_by_user"
    endpoint.updated_at = now or timezone.now()
    endpoint.save()
    _audit(actor, endpoint, AuditAction.WEBHOOK_ENDPOINT_UPDATE, {"fields": sorted(fields)})
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint: WebhookEndpoint, actor: Actor) -> None:
    """Delete an endpoint with its deliveries and attempts. Raises LabError (``require_endpoint_manager``)."""
    require_endpoint_manager(actor=actor, project=endpoint.project)
    _audit(actor, endpoint, AuditAction.WEBHOOK_ENDPOINT_DELETE, {})
    endpoint.delete()


@transaction.atomic
def endpoint_rotate_secret(*, endpoint: WebhookEndpoint, actor: Actor, now: datetime | None = None) -> WebhookEndpoint:
    """Give the endpoint a new secret; the old one also signs for 24 h so receivers can switch.

    Raises LabError (``require_endpoint_manager``).
    """
    require_endpoint_manager(actor=actor, project=endpoint.project)
    now = now or timezone.now()
    endpoint = WebhookEndpoint.objects.unscoped().select_for_update().get(pk=endpoint.pk)
    endpoint.previous_secret = endpoint.secret
    endpoint.previous_secret_expires_at = now + PREVIOUS_SECRET_TTL
    endpoint.secret = new_secret()
    endpoint.updated_at = now
    endpoint.save(update_fields=["previous_secret", "previous_secret_expires_at", "secret", "updated_at"])
    _audit(actor, endpoint, AuditAction.WEBHOOK_ENDPOINT_ROTATE_SECRET, {})
    return endpoint


@transaction.atomic
def endpoint_send_test(*, endpoint: WebhookEndpoint, actor: Actor, now: datetime | None = None) -> WebhookDelivery:
    """Send a ``webhook.test`` event to this endpoint only; return its delivery.

    Raises LabError (``require_endpoint_manager``), or 409 ``invalid_state`` when the
    endpoint is disabled.
    """
    require_endpoint_manager(actor=actor, project=endpoint.project)
    if not endpoint.enabled:
        raise LabError("invalid_state", "This endpoint is disabled; enable it to send a test event.")
    now = now or timezone.now()
    data = {"endpoint_id": endpoint.public_id, "message": "This is a test event from Lab."}
    (delivery,) = outbox.publish(
        project_id=endpoint.project_id, type=TEST_EVENT_TYPE, data=data, endpoints=[endpoint], created_at=now, now=now
    )
    _audit(actor, endpoint, AuditAction.WEBHOOK_ENDPOINT_TEST, {"delivery": delivery.public_id})
    return delivery


@transaction.atomic
def delivery_redeliver(*, delivery: WebhookDelivery, actor: Actor, now: datetime | None = None) -> WebhookDelivery:
    """Try a delivery again now, with the same ``webhook-id`` and body.

    A delivery that had used up its schedule gets one more try. Raises LabError ``insufficient_scope`` or ``not_found``
    (``require_endpoint_manager``), or 409 ``invalid_state`` when the endpoint is disabled.
    """
    require_endpoint_manager(actor=actor, project=delivery.endpoint.project)
    now = now or timezone.now()
    delivery = WebhookDelivery.objects.select_for_update().select_related("endpoint", "message").get(pk=delivery.pk)
    if not delivery.endpoint.enabled:
        raise LabError("invalid_state", "This endpoint is disabled; enable it to redeliver.")
    delivery.status = DeliveryStatus.PENDING
    delivery.next_attempt_at = now
    delivery.finished_at = None
    delivery.save(update_fields=["status", "next_attempt_at", "finished_at"])
    _audit(actor, delivery.endpoint, AuditAction.WEBHOOK_DELIVERY_REDELIVER, {"delivery": delivery.public_id})
    outbox.deliver_on_commit([delivery.pk])
    return delivery


def _audit(actor: Actor, endpoint: WebhookEndpoint, action: AuditAction, data: dict[str, Any]) -> None:
    project = endpoint.project
    audit_record(
        actor=actor,
        organization=project.organization,
        project=project,
        action=action,
        target=endpoint.public_id,
        data=data,
    )
