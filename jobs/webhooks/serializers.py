"""JSON shapes of webhook endpoints and deliveries (docs/api.md)."""

from __future__ import annotations

from typing import Any

from jobs.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from lab.formats import iso


def endpoint_to_dict(endpoint: WebhookEndpoint, *, include_secret: bool = False) -> dict[str, Any]:
    """Return the WebhookEndpoint object; ``secret`` only when asked (create and rotate answers)."""
    body = {
        "id": endpoint.public_id,
        "object": "webhook_endpoint",
        "url": endpoint.url,
        "events": list(endpoint.events),
        "enabled": endpoint.enabled,
        "created_at": iso(endpoint.created_at),
    }
    if include_secret:
        body["secret"] = endpoint.secret
    return body


def attempt_to_dict(attempt: WebhookAttempt) -> dict[str, Any]:
    """Return one HTTP try: when, how long (ms), the status code or the error, the answer's start."""
    return {
        "number": attempt.number,
        "created_at": iso(attempt.started_at),
        "duration_ms": attempt.duration_ms,
        "status_code": attempt.status_code,
        "succeeded": attempt.succeeded,
        "error": attempt.error or None,
        "response_excerpt": attempt.response_excerpt,
        "request_headers": attempt.request_headers,
    }


def delivery_to_dict(delivery: WebhookDelivery) -> dict[str, Any]:
    """Return a delivery with its request body and every attempt (oldest first)."""
    message = delivery.message
    return {
        "id": delivery.public_id,
        "object": "webhook_delivery",
        "endpoint_id": delivery.endpoint.public_id,
        "event_id": message.public_id,
        "event_type": message.type,
        "status": delivery.status,
        "attempt_count": delivery.attempt_count,
        "next_attempt_at": iso(delivery.next_attempt_at) if delivery.status == "pending" else None,
        "created_at": iso(delivery.created_at),
        "finished_at": iso(delivery.finished_at),
        "request_body": message.body,
        "attempts": [attempt_to_dict(attempt) for attempt in sorted(delivery.attempts.all(), key=lambda a: a.number)],
    }
