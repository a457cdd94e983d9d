"""Webhook delivery: claim due deliveries, sign and send them, record each try, track endpoint health.

Signing (https://www.standardwebhooks.com/, spec v1): headers ``webhook-id`` (the delivery's
``msg_...``, the same on every retry), ``webhook-timestamp`` (Unix seconds of this try) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, made by the
``standardwebhooks`` library with the endpoint's ``whsec_...`` secret; during the 24 h after a
rotation, a second signature with the previous secret follows, space-separated, as the spec
allows).

Claiming: due rows are locked with ``SELECT ... FOR UPDATE SKIP LOCKED`` and their
``next_attempt_at`` pushed forward by ``lease()`` before any HTTP, so a worker killed
mid-delivery leads to a retry (by ``jobs.webhooks.sweep``), never a loss or a double claim.

Retries: 2xx is delivered. Whether a failed try is tried again is
``labsdk.retry.is_retryable_status``, the rule the SDK and the engine use too: no answer
(network errors, timeouts), 429 and 5xx are retried on the outbox's schedule; any other status
fails the delivery at once: 4xx (408 included) is the receiver's word on this message, and 3xx
leads nowhere since redirects are never followed (saleor's webhooks do the same). A refused
address fails it at once too.

Endpoint health: an endpoint whose tries have failed without a success for 5 days is disabled,
with a ``webhook_endpoint.disabled`` event to the project's other endpoints. An endpoint whose
URL can never be sent (refused as written, e.g. stored before the URL rules refused it) is
disabled at its first try (``disabled_reason`` ``invalid_url``), with the same event.

Every function that depends on the time takes ``now`` so tests can inject the clock; the
signature timestamp is always the real time of sending (receivers check it against theirs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from labsdk.retry import is_retryable_status
from standardwebhooks import Webhook

from jobs.webhooks import outbox
from jobs.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.webhooks.serializers import endpoint_to_dict
from lab.audit import Actor, AuditAction, audit_record
from lab.lib.http import RequestFailed, SafeClient, UnsafeURL

logger = logging.getLogger(__name__)

#: An endpoint failing this long without a success is disabled (as Svix does).
DISABLE_AFTER = timedelta(days=5)
#: Retries due within this many seconds are queued with a countdown; later ones wait for the sweep.
COUNTDOWN_LIMIT_S = 60


def lease() -> timedelta:
    """Return how long a claimed delivery stays with its worker: twice the request timeout plus
    ``LAB_WEBHOOK_LEASE_MARGIN_S`` (30 s by default).

    A batch's requests run in parallel, so a live worker finishes well within it; after it, the
    sweep hands the delivery to another worker (the first one died or hung).
    """
    return timedelta(seconds=2 * settings.LAB_WEBHOOK_TIMEOUT_S + settings.LAB_WEBHOOK_LEASE_MARGIN_S)


@dataclass(frozen=True)
class DeliveryResult:
    """What one try of one delivery gave: delivered, or why not and whether to retry."""

    delivery_id: int
    succeeded: bool
    retryable: bool
    status_code: int | None
    error: str
    duration_ms: int
    #: The endpoint's URL is refused as written and can never be sent: the endpoint is disabled.
    url_refused: bool = False


_clients: dict[tuple[float, bool], SafeClient] = {}
_clients_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _client() -> SafeClient:
    """Return this process's pooled client for the current timeout and private-address setting."""
    key = (float(settings.LAB_WEBHOOK_TIMEOUT_S), bool(settings.LAB_WEBHOOK_ALLOW_PRIVATE))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = SafeClient(timeout=key[0], allow_private=key[1])
        return client


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _clients_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=outbox.BATCH_SIZE, thread_name_prefix="webhook")
        return _executor


def signature_headers(
    delivery: WebhookDelivery, *, timestamp: int | None = None, now: datetime | None = None
) -> dict[str, str]:
    """Return the request headers of one try: content type and the three Standard Webhooks headers.

    ``timestamp`` (Unix seconds) defaults to the real current time.
    """
    timestamp = int(time.time()) if timestamp is None else timestamp
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    endpoint = delivery.endpoint
    secrets_to_sign = [endpoint.secret]
    now = now or timezone.now()
    if endpoint.previous_secret and endpoint.previous_secret_expires_at and endpoint.previous_secret_expires_at > now:
        secrets_to_sign.append(endpoint.previous_secret)
    body = delivery.message.body
    signatures = " ".join(
        Webhook(secret).sign(msg_id=delivery.public_id, timestamp=moment, data=body) for secret in secrets_to_sign
    )
    return {
        "content-type": "application/json",
        "webhook-id": delivery.public_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


def claim_deliveries(
    delivery_ids: list[int] | None, *, now: datetime, limit: int = outbox.BATCH_SIZE
) -> list[WebhookDelivery]:
    """Claim due, pending deliveries of enabled endpoints (``delivery_ids``, or any when None).

    Locks rows with ``SKIP LOCKED`` so concurrent workers never claim the same row, counts the
    try and pushes ``next_attempt_at`` by ``lease()``. Returns them with endpoint and message loaded.
    """
    with transaction.atomic():
        due = WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING,
            next_attempt_at__lte=now + timedelta(seconds=1),
            endpoint__enabled=True,
        )
        if delivery_ids is not None:
            due = due.filter(pk__in=delivery_ids)
        ids = list(
            due.select_for_update(skip_locked=True, of=("self",))
            .order_by("next_attempt_at")
            .values_list("pk", flat=True)[:limit]
        )
        if not ids:
            return []
        WebhookDelivery.objects.filter(pk__in=ids).update(
            attempt_count=F("attempt_count") + 1, next_attempt_at=now + lease(), last_attempt_at=now
        )
        return list(WebhookDelivery.objects.filter(pk__in=ids).select_related("endpoint", "message").order_by("pk"))


def _send(delivery: WebhookDelivery, headers: dict[str, str], client: SafeClient) -> tuple[DeliveryResult, str]:
    try:
        response = client.post(delivery.endpoint.url, content=delivery.message.body.encode(), headers=headers)
    except UnsafeURL as exc:
        error = f"refused: {exc.message}"[:300]
        return DeliveryResult(delivery.pk, False, False, None, error, 0, url_refused=exc.permanent), ""
    except RequestFailed as exc:
        error = exc.message.replace("\x00", "")[:300]
        return DeliveryResult(delivery.pk, False, is_retryable_status(None), None, error, exc.duration_ms), ""
    except Exception as exc:  # never lose the bookkeeping of the others over one bad try
        logger.exception("webhook try crashed", extra={"delivery": delivery.public_id})
        return DeliveryResult(delivery.pk, False, True, None, f"internal error: {type(exc).__name__}", 0), ""
    code = response.status_code
    succeeded = 200 <= code < 300
    retryable = is_retryable_status(code)
    error = "" if succeeded else f"HTTP {code}"
    return DeliveryResult(delivery.pk, succeeded, retryable, code, error, response.duration_ms), response.excerpt


def deliver(
    delivery_ids: list[int] | None, *, now: datetime | None = None, limit: int = outbox.BATCH_SIZE
) -> list[DeliveryResult]:
    """Claim and send due deliveries (the given ids, or any due when None) concurrently; record results.

    ``now`` is the clock for claiming, scheduling and endpoint health (tests inject it).
    Returns one DeliveryResult per delivery tried.
    """
    clock = now or timezone.now()
    claimed = claim_deliveries(delivery_ids, now=clock, limit=limit)
    if not claimed:
        return []
    client = _client()
    started_at = timezone.now() if now is None else clock
    prepared = [(delivery, signature_headers(delivery, now=clock)) for delivery in claimed]
    if len(prepared) == 1:
        outcomes = [_send(prepared[0][0], prepared[0][1], client)]
    else:
        outcomes = list(_pool().map(lambda item: _send(item[0], item[1], client), prepared))
    finished = (clock + (timezone.now() - started_at)) if now is None else clock
    _record(prepared, outcomes, started_at=started_at, now=finished)
    return [result for result, _ in outcomes]


def _record(prepared, outcomes, *, started_at: datetime, now: datetime) -> None:
    """Store attempts, move each delivery on, and track endpoint health, in one transaction."""
    retry_soon: list[tuple[int, float]] = []
    with transaction.atomic():
        WebhookAttempt.objects.bulk_create(
            [
                WebhookAttempt(
                    delivery=delivery,
                    number=delivery.attempt_count,
                    started_at=started_at,
                    duration_ms=result.duration_ms,
                    status_code=result.status_code,
                    error=result.error,
                    response_excerpt=excerpt,
                    request_headers=headers,
                    succeeded=result.succeeded,
                )
                for (delivery, headers), (result, excerpt) in zip(prepared, outcomes, strict=False)
            ]
        )
        # Successes are the common case: one UPDATE per (try number, status code), not per row.
        # Each UPDATE is conditional on the try number this worker claimed, so the result of a
        # try whose lease ran out (and was claimed again) is ignored.
        succeeded: dict[tuple[int, int | None], list[int]] = defaultdict(list)
        failed_endpoints: dict[int, WebhookEndpoint] = {}
        unsendable_endpoints: dict[int, WebhookEndpoint] = {}
        recovered_endpoints: set[int] = set()
        for (delivery, _headers), (result, _excerpt) in zip(prepared, outcomes, strict=False):
            if result.succeeded:
                succeeded[(delivery.attempt_count, result.status_code)].append(delivery.pk)
                if delivery.endpoint.failing_since is not None:
                    recovered_endpoints.add(delivery.endpoint_id)
                continue
            held = WebhookDelivery.objects.filter(
                pk=delivery.pk, status=DeliveryStatus.PENDING, attempt_count=delivery.attempt_count
            )
            common = {"last_status_code": result.status_code, "last_error": result.error}
            if result.url_refused:
                unsendable_endpoints[delivery.endpoint_id] = delivery.endpoint
            else:
                failed_endpoints[delivery.endpoint_id] = delivery.endpoint
            delay = outbox.retry_delay(delivery.attempt_count) if result.retryable else None
            if delay is None:
                held.update(status=DeliveryStatus.FAILED, next_attempt_at=None, finished_at=now, **common)
            else:
                held.update(next_attempt_at=now + timedelta(seconds=delay), **common)
                if delay <= COUNTDOWN_LIMIT_S:
                    retry_soon.append((delivery.pk, delay))
        for (attempt_count, status_code), ids in succeeded.items():
            WebhookDelivery.objects.filter(
                pk__in=ids, status=DeliveryStatus.PENDING, attempt_count=attempt_count
            ).update(
                status=DeliveryStatus.SUCCEEDED,
                next_attempt_at=None,
                finished_at=now,
                last_status_code=status_code,
                last_error="",
            )
        if recovered_endpoints:
            WebhookEndpoint.objects.unscoped().filter(pk__in=recovered_endpoints).update(failing_since=None)
        for endpoint_id, endpoint in failed_endpoints.items():
            if endpoint_id in recovered_endpoints or endpoint_id in unsendable_endpoints:
                continue
            _note_failure(endpoint, now=now)
        for endpoint in unsendable_endpoints.values():
            # Retrying cannot help: the URL is refused before any network use.
            endpoint_disable(endpoint=endpoint, reason="invalid_url", now=now)
        for delivery_id, delay in retry_soon:
            outbox.deliver_on_commit([delivery_id], countdown=delay)


def _note_failure(endpoint: WebhookEndpoint, *, now: datetime) -> None:
    """Start the endpoint's failure clock, or disable it when it has run for ``DISABLE_AFTER``."""
    if endpoint.failing_since is None:
        WebhookEndpoint.objects.unscoped().filter(pk=endpoint.pk, failing_since__isnull=True).update(failing_since=now)
        return
    if now - endpoint.failing_since < DISABLE_AFTER:
        return
    endpoint_disable(endpoint=endpoint, reason="failing_for_5_days", now=now)


def endpoint_disable(*, endpoint: WebhookEndpoint, reason: str, now: datetime | None = None) -> bool:
    """Disable an endpoint Lab gave up on; fail its pending deliveries; send ``webhook_endpoint.disabled``.

    Lab acts by itself here (the audit row's actor is the system). The event goes to the
    project's other enabled endpoints subscribed to it (the disabled one cannot hear it); its
    ``data`` is the endpoint object. Returns False when it was already disabled.
    """
    now = now or timezone.now()
    with transaction.atomic():
        changed = WebhookEndpoint.objects.unscoped().filter(pk=endpoint.pk, enabled=True).update(
            enabled=False, disabled_reason=reason, updated_at=now
        )
        if not changed:
            return False
        endpoint.refresh_from_db()
        WebhookDelivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.FAILED, next_attempt_at=None, finished_at=now, last_error="endpoint disabled"
        )
        audit_record(
            actor=Actor.system(),
            organization=endpoint.project.organization,
            project=endpoint.project,
            action=AuditAction.WEBHOOK_ENDPOINT_DISABLE,
            target=endpoint.public_id,
            data={"reason": reason},
        )
        listeners = [
            other
            for other in WebhookEndpoint.objects.filter(project_id=endpoint.project_id, enabled=True).order_by("pk")
            if "webhook_endpoint.disabled" in other.events
        ]
        if listeners:
            outbox.publish(
                project_id=endpoint.project_id,
                type="webhook_endpoint.disabled",
                data=endpoint_to_dict(endpoint),
                endpoints=listeners,
                created_at=now,
                now=now,
            )
    logger.warning("webhook endpoint disabled", extra={"endpoint": endpoint.public_id, "reason": reason})
    return True
