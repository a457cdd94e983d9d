"""``lab.webhooks``: a project's webhook endpoints and their deliveries (docs/webhooks.md).

An endpoint is a URL Lab sends job and checkpoint events to, signed with the endpoint's
``whsec_...`` secret; :func:`labsdk.webhooks.verify` checks them on the receiving side. Creating,
changing, testing and deleting endpoints need an API key with the ``write`` scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import Field

from labsdk._common import paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.types import LabObject

__all__ = ["WebhookAttempt", "WebhookDelivery", "WebhookEndpoint", "Webhooks"]


class WebhookEndpoint(LabObject):
    """A webhook endpoint: its ``url``, the event types it gets (``events``), whether it is
    ``enabled``. ``secret`` (``whsec_...``) is set only on the answers of :meth:`Webhooks.create`
    and :meth:`Webhooks.rotate_secret`: keep it then, Lab never shows it again."""

    id: str
    url: str = ""
    events: list[str] = Field(default_factory=list)
    enabled: bool | None = None
    created_at: datetime | None = None
    secret: str | None = None


class WebhookAttempt(LabObject):
    """One HTTP try of a delivery: its ``status_code`` or ``error``, how long it took (ms)."""

    number: int | None = None
    created_at: datetime | None = None
    duration_ms: int | None = None
    status_code: int | None = None
    succeeded: bool | None = None
    error: str | None = None
    response_excerpt: str | None = None


class WebhookDelivery(LabObject):
    """One event sent to one endpoint: ``status`` is ``pending`` (retries left), ``succeeded``
    or ``failed``; ``attempts`` oldest first."""

    id: str
    endpoint_id: str | None = None
    event_id: str | None = None
    event_type: str | None = None
    status: str | None = None
    attempt_count: int | None = None
    next_attempt_at: datetime | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    request_body: Any = None
    attempts: list[WebhookAttempt] = Field(default_factory=list)


class Webhooks:
    """``/webhook-endpoints``: create, list, retrieve, update, delete, test and rotate the
    secret of endpoints; list and redeliver their deliveries. Errors are Lab's: 400
    ``invalid_request`` for a refused URL or event type (``errors[0].param`` says which, e.g.
    ``private_address`` for a loopback URL unless Lab runs with ``LAB_WEBHOOK_ALLOW_PRIVATE=1``),
    403 without the ``write`` scope, 404 for an endpoint outside the project."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def create(self, url: str, events: Sequence[str] | None = None) -> WebhookEndpoint:
        """Create an endpoint for ``url`` getting ``events`` (default every event type); the answer
        carries its ``secret``."""
        body: dict[str, Any] = {"url": url}
        if events is not None:
            body["events"] = list(events)
        return parse(WebhookEndpoint, self._http.request("POST", "webhook-endpoints", json_body=body))

    def list(self, *, limit: int = 100) -> list[WebhookEndpoint]:
        """Return the project's endpoints, newest first (without their secrets)."""
        return [*paginate(self._http, "webhook-endpoints", WebhookEndpoint, {"limit": limit})]

    def retrieve(self, endpoint_id: str) -> WebhookEndpoint:
        """Return one endpoint (without its secret)."""
        return parse(WebhookEndpoint, self._http.request("GET", f"webhook-endpoints/{segment(endpoint_id)}"))

    def update(
        self, endpoint_id: str, *, url: str | None = None, events: Sequence[str] | None = None,
        enabled: bool | None = None,
    ) -> WebhookEndpoint:
        """Change an endpoint's ``url``, ``events`` or ``enabled`` (those given); enabling a
        disabled endpoint forgets its past failures."""
        body: dict[str, Any] = {"url": url, "events": None if events is None else list(events), "enabled": enabled}
        body = {key: value for key, value in body.items() if value is not None}
        return parse(WebhookEndpoint, self._http.request(
            "PATCH", f"webhook-endpoints/{segment(endpoint_id)}", json_body=body,
        ))

    def delete(self, endpoint_id: str) -> None:
        """Delete an endpoint; its pending deliveries are not sent."""
        self._http.request("DELETE", f"webhook-endpoints/{segment(endpoint_id)}")

    def test(self, endpoint_id: str) -> WebhookDelivery:
        """Send the endpoint a ``webhook.test`` event now; return its delivery (``pending`` until
        the first try ends: :meth:`deliveries` shows how it went)."""
        return parse(WebhookDelivery, self._http.request("POST", f"webhook-endpoints/{segment(endpoint_id)}/test"))

    def rotate_secret(self, endpoint_id: str) -> WebhookEndpoint:
        """Give the endpoint a new secret (returned in ``secret``); the old one keeps signing, as
        a second signature, for 24 hours."""
        return parse(WebhookEndpoint, self._http.request(
            "POST", f"webhook-endpoints/{segment(endpoint_id)}/rotate-secret",
        ))

    def deliveries(self, endpoint_id: str, *, status: str | None = None, limit: int = 100) -> list[WebhookDelivery]:
        """Return the endpoint's deliveries, newest first, each with its attempts; ``status``
        (``pending``, ``succeeded``, ``failed``) keeps only those."""
        return [*paginate(
            self._http, f"webhook-endpoints/{segment(endpoint_id)}/deliveries", WebhookDelivery,
            {"limit": limit, "status": status},
        )]

    def redeliver(self, endpoint_id: str, delivery_id: str) -> WebhookDelivery:
        """Send a delivery again now; return it."""
        return parse(WebhookDelivery, self._http.request(
            "POST", f"webhook-endpoints/{segment(endpoint_id)}/deliveries/{segment(delivery_id)}/redeliver",
        ))
