"""OpenAPI components of the webhook endpoint and delivery bodies (docs/api.md), as
``jobs/webhooks/serializers.py`` builds them and ``jobs.webhooks.schemas`` accepts them.

The endpoint's ``secret`` is only in ``WebhookEndpointWithSecret``, the answer of create and
rotate (and even there an ``Idempotency-Key`` replay leaves it out).
"""

from __future__ import annotations

from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from jobs.webhooks.models import DeliveryStatus
from lab.api.schema import (
    BOOLEAN,
    INTEGER,
    STRING,
    TIMESTAMP,
    component,
    list_component,
    nullable,
    obj,
)

#: The form ``lab.lib.http.check_url`` requires: http(s), a host (and port) without user info,
#: white space or control characters, then printable ASCII other than <>"{}|\^`. A host of numbers
#: alone is an IPv4 address (``0`` is 0.0.0.0, ``2130706433`` is 127.0.0.1): the pattern takes it
#: only as four dotted decimal numbers outside 0.0.0.0/8, which is always refused. ``check_url``
#: also refuses hosts IDNA 2008 does not allow and addresses that are private (unless
#: LAB_WEBHOOK_ALLOW_PRIVATE) or otherwise not public, which a pattern cannot say.
_NUMBER_LABEL = r"(?:0[xX][0-9a-fA-F]*|[0-9]+)"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_URL_HOST = (
    rf"(?:(?!0\.){_OCTET}(?:\.{_OCTET}){{3}}(?::[0-9]+)?"
    rf"|(?!{_NUMBER_LABEL}(?:\.{_NUMBER_LABEL})*\.?(?::[0-9]*)?(?:[/?#]|$))[^\x00-\x20\x7f/?#@]+)"
)
_URL = {
    "type": "string",
    "maxLength": 2048,
    "pattern": rf"^https?://{_URL_HOST}(?:[/?#][!#-;=?-\[\]_a-z~]*)?$",
    "description": "http(s) on a host that does not resolve to a private address",
}
_EVENTS = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "string", "enum": list(WEBHOOK_EVENT_TYPES)},
    "description": "event types sent to it",
}
_ENDPOINT_PROPERTIES = {
    "id": STRING,
    "object": {"const": "webhook_endpoint"},
    "url": STRING,
    "events": _EVENTS,
    "enabled": BOOLEAN,
    "created_at": TIMESTAMP,
}

WEBHOOK_ENDPOINT = component(
    "WebhookEndpoint",
    obj(_ENDPOINT_PROPERTIES, description="A URL of the project that receives events (whep_...)."),
)
WEBHOOK_ENDPOINT_WITH_SECRET = component(
    "WebhookEndpointWithSecret",
    obj(
        _ENDPOINT_PROPERTIES
        | {
            "secret": {
                "type": "string",
                "pattern": "^whsec_",
                "description": "the signing secret (Standard Webhooks); shown once, absent from a replay",
            }
        },
        optional=("secret",),
        description="A webhook endpoint as created or rotated: with its signing secret.",
    ),
)
WEBHOOK_ENDPOINT_LIST = list_component("WebhookEndpoint", "The project's webhook endpoints, newest first.")

WEBHOOK_ENDPOINT_CREATE = component(
    "WebhookEndpointCreate",
    obj(
        {"url": _URL, "events": _EVENTS | {"description": "default: every event type"}, "enabled": BOOLEAN},
        optional=("events", "enabled"),
    )
    | {"additionalProperties": False},
)
WEBHOOK_ENDPOINT_UPDATE = component(
    "WebhookEndpointUpdate",
    obj({"url": _URL, "events": _EVENTS, "enabled": BOOLEAN}, optional=("url", "events", "enabled"))
    | {"additionalProperties": False},
)

WEBHOOK_ATTEMPT = component(
    "WebhookAttempt",
    obj(
        {
            "number": INTEGER,
            "created_at": TIMESTAMP,
            "duration_ms": INTEGER,
            "status_code": nullable(INTEGER),
            "succeeded": BOOLEAN,
            "error": nullable(STRING),
            "response_excerpt": STRING,
            "request_headers": {"type": "object", "additionalProperties": STRING},
        },
        description="One HTTP try of a delivery.",
    ),
)
WEBHOOK_DELIVERY = component(
    "WebhookDelivery",
    obj(
        {
            "id": STRING,
            "object": {"const": "webhook_delivery"},
            "endpoint_id": STRING,
            "event_id": STRING,
            "event_type": STRING,
            "status": {"type": "string", "enum": list(DeliveryStatus.values)},
            "attempt_count": INTEGER,
            "next_attempt_at": nullable(TIMESTAMP),
            "created_at": TIMESTAMP,
            "finished_at": nullable(TIMESTAMP),
            "request_body": STRING | {"description": "the JSON text posted and signed on every try"},
            "attempts": {"type": "array", "items": WEBHOOK_ATTEMPT},
        },
        description="One event to one endpoint, tried until a 2xx or the retry schedule ends.",
    ),
)
WEBHOOK_DELIVERY_LIST = list_component("WebhookDelivery", "An endpoint's deliveries, newest first.")
