"""Webhook endpoint services: create, change, rotate the secret, test, delete, redeliver.

Each runs in one transaction and writes an audit row (``lab.audit``). A secret is
``whsec_<base64>`` (Standard Webhooks), shown by the callers on create and rotate only.
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
from jobs.webhooks.events import TEST_EVENT_TYPE, WEBHOOK_EVENT_TYPES
from jobs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from lab.api.errors import ApiError, FieldError
from lab.audit import Actor, AuditAction, audit_record
from lab.lib.http import UnsafeURL, check_url, mask_url
from lab.models import Project

#: How long the previous secret keeps signing after a rotation.
PREVIOUS_SECRET_TTL = timedelta(hours=24)
_ENDPOINT_FIELDS = ("url", "events", "enabled")


def new_secret() -> str:
    """Return a fresh ``whsec_<base64 of 24 random bytes>`` secret (Standard Webhooks format)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def parse_endpoint_input(data: Any, *, creating: bool) -> dict[str, Any]:
    """Validate a create/PATCH body; return the fields given, cleaned.

    ``url``: http(s), at most 2,048 characters, a host the client can send to as written (IDNA
    2008, no trailing dot), not resolving to a refused address (private and loopback ones are
    allowed only with ``LAB_WEBHOOK_ALLOW_PRIVATE``; IPv6 forms that carry an IPv4 address are
    judged by it: ``lab.lib.http.check_url``); required on create.
    ``events``: a non-empty list of ``WEBHOOK_EVENT_TYPES`` (default: all of them).
    ``enabled``: a boolean. Raises ApiError 400 ``invalid_request`` listing every problem.
    """
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "The body must be a JSON object.")
    errors: list[FieldError] = []
    cleaned: dict[str, Any] = {}
    for key in data:
        if key not in _ENDPOINT_FIELDS:
            errors.append(
                FieldError(_printable(key), "unknown_field", f"Unknown field; allowed: {', '.join(_ENDPOINT_FIELDS)}.")
            )
    if "url" in data or creating:
        url = data.get("url")
        if not isinstance(url, str) or not url.strip():
            errors.append(FieldError("url", "required" if url is None else "invalid_url", "Give the endpoint's URL."))
        else:
            url = url.strip()
            try:
                check_url(url, allow_private=settings.LAB_WEBHOOK_ALLOW_PRIVATE)
                cleaned["url"] = url
            except UnsafeURL as exc:
                message = exc.message
                if exc.code == "private_address":
                    message += " Private and loopback addresses need LAB_WEBHOOK_ALLOW_PRIVATE."
                errors.append(FieldError("url", exc.code, message))
    if "events" in data:
        events = data["events"]
        if not isinstance(events, list) or not events:
            errors.append(FieldError("events", "invalid", "events must be a non-empty list of event types."))
        else:
            chosen: list[str] = []
            for index, event_type in enumerate(events):
                if not isinstance(event_type, str) or event_type not in WEBHOOK_EVENT_TYPES:
                    errors.append(
                        FieldError(
                            f"events.{index}",
                            "unknown_event_type",
                            f"Unknown event type; choose from {', '.join(WEBHOOK_EVENT_TYPES)}.",
                        )
                    )
                elif event_type not in chosen:
                    chosen.append(event_type)
            cleaned["events"] = chosen
    elif creating:
        cleaned["events"] = list(WEBHOOK_EVENT_TYPES)
    if "enabled" in data:
        if not isinstance(data["enabled"], bool):
            errors.append(FieldError("enabled", "invalid", "enabled must be true or false."))
        else:
            cleaned["enabled"] = data["enabled"]
    if errors:
        message = errors[0].message if len(errors) == 1 else f"{len(errors)} problems in the request."
        raise ApiError(400, "invalid_request", message, errors=errors)
    return cleaned


def _printable(key: Any) -> str:
    """Return ``key`` cut to 100 characters with lone surrogates escaped, so the error body encodes."""
    return str(key)[:100].encode("utf-8", "backslashreplace").decode("utf-8")


@transaction.atomic
def endpoint_create(*, project: Project, actor: Actor, data: Any) -> WebhookEndpoint:
    """Create an endpoint from a request body (see ``parse_endpoint_input``) with a new secret."""
    fields = parse_endpoint_input(data, creating=True)
    endpoint = WebhookEndpoint.objects.create(project=project, secret=new_secret(), **fields)
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
    """Change ``url``, ``events`` and/or ``enabled``; enabling again forgets past failures."""
    fields = parse_endpoint_input(data, creating=False)
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
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
    """Delete an endpoint with its deliveries and attempts."""
    _audit(actor, endpoint, AuditAction.WEBHOOK_ENDPOINT_DELETE, {})
    endpoint.delete()


@transaction.atomic
def endpoint_rotate_secret(*, endpoint: WebhookEndpoint, actor: Actor, now: datetime | None = None) -> WebhookEndpoint:
    """Give the endpoint a new secret; the old one also signs for 24 h so receivers can switch."""
    now = now or timezone.now()
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
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

    Raises ApiError 409 ``invalid_state`` when the endpoint is disabled.
    """
    if not endpoint.enabled:
        raise ApiError(409, "invalid_state", "This endpoint is disabled; enable it to send a test event.")
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

    A delivery that had used up its schedule gets one more try. Raises ApiError 409
    ``invalid_state`` when the endpoint is disabled.
    """
    now = now or timezone.now()
    delivery = WebhookDelivery.objects.select_for_update().select_related("endpoint", "message").get(pk=delivery.pk)
    if not delivery.endpoint.enabled:
        raise ApiError(409, "invalid_state", "This endpoint is disabled; enable it to redeliver.")
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
