"""Webhook services: endpoints, the outbox, and delivery (Standard Webhooks, DESIGN.md §4).

Format (https://www.standardwebhooks.com/, spec v1): the body is
``{"id": "evt_...", "type": "...", "created_at": "<ISO 8601>", "data": {...}}``; headers
``webhook-id`` (the delivery's ``msg_...``, the same on every retry), ``webhook-timestamp``
(Unix seconds of this try) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of
"id.timestamp.body">``, made by the ``standardwebhooks`` library with the endpoint's
``whsec_...`` secret; during the 24 h after a rotation, a second signature with the previous
secret follows, space-separated, as the spec allows).

Outbox: ``enqueue_event`` runs inside the transaction that records a JobEvent, so the delivery
rows exist exactly when the event does; a Celery task is queued on commit. Delivery claims due
rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` and pushes ``next_attempt_at`` forward by a
lease before any HTTP, so a worker killed mid-delivery leads to a retry (by the periodic sweep),
never a loss or a double claim.

Retries: 2xx is delivered; network errors, timeouts, 429 and 5xx are retried after the delays of
``LAB_WEBHOOK_RETRY_SCHEDULE`` (Svix's schedule by default: 0 s, 5 s, 5 min, 30 min, 2 h, 5 h,
10 h, 10 h; see https://docs.svix.com/retries) with ±10 % jitter; any other status (3xx, 4xx) or
a refused address fails the delivery at once. An endpoint whose attempts have failed without a
success for 5 days is disabled, with a ``webhook_endpoint.disabled`` event to the project's
other endpoints. An endpoint whose URL can never be sent (refused as written, e.g. stored before
the URL rules refused it) is disabled at its first try (``disabled_reason`` ``invalid_url``),
with the same event.

Every function that depends on the time takes ``now`` so tests can inject the clock; the
signature timestamp is always the real time of sending (receivers check it against theirs).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import secrets
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from standardwebhooks import Webhook

from jobs.webhooks.models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookMessage,
)
from jobs.webhooks.serializers import endpoint_to_dict
from lab.api.errors import ApiError, FieldError
from lab.api.formats import iso
from lab.lib.http import MAX_URL_LENGTH, RequestFailed, SafeClient, UnsafeURL, check_url, mask_url
from lab.models import Project
from lab.services import Actor, audit_record

logger = logging.getLogger(__name__)

#: The event types an endpoint may subscribe to (DESIGN.md §4 "Webhooks").
WEBHOOK_EVENT_TYPES = (
    "job.queued",
    "job.started",
    "job.requeued",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.data_incomplete",
    "checkpoint.ready",
    "webhook_endpoint.disabled",
)
TEST_EVENT_TYPE = "webhook.test"
#: An endpoint failing this long without a success is disabled (as Svix does).
DISABLE_AFTER = timedelta(days=5)
#: The sweep leaves deliveries due less than this long to the task already queued for them, so a
#: short backlog in the queue does not get every pending delivery queued a second time.
SWEEP_GRACE = timedelta(seconds=15)
#: Retries due within this many seconds are queued with a countdown; later ones wait for the sweep.
COUNTDOWN_LIMIT_S = 60
#: Deliveries handed to one task (sent concurrently by one worker process).
BATCH_SIZE = 25
#: Finished deliveries (and their messages and attempts) are kept this long for the dashboard.
KEEP_DELIVERIES_FOR = timedelta(days=30)
#: The sweep purges old deliveries at most this often.
PURGE_INTERVAL_S = 600
#: How long the previous secret keeps signing after a rotation.
PREVIOUS_SECRET_TTL = timedelta(hours=24)
_ENDPOINT_FIELDS = ("url", "events", "enabled")


def lease() -> timedelta:
    """Return how long a claimed delivery stays with its worker: twice the request timeout plus 30 s.

    A batch's requests run in parallel, so a live worker finishes well within it; after it, the
    sweep hands the delivery to another worker (the first one died or hung).
    """
    return timedelta(seconds=2 * settings.LAB_WEBHOOK_TIMEOUT_S + 30)


# --- endpoints ---------------------------------------------------------------------------------


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
    _audit(actor, endpoint, "webhook_endpoint.create", {"url": mask_url(endpoint.url), "events": endpoint.events})
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
    _audit(actor, endpoint, "webhook_endpoint.update", {"fields": sorted(fields)})
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint: WebhookEndpoint, actor: Actor) -> None:
    """Delete an endpoint with its deliveries and attempts."""
    _audit(actor, endpoint, "webhook_endpoint.delete", {})
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
    _audit(actor, endpoint, "webhook_endpoint.rotate_secret", {})
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
    (delivery,) = _publish(
        project_id=endpoint.project_id, type=TEST_EVENT_TYPE, data=data, endpoints=[endpoint], created_at=now, now=now
    )
    _audit(actor, endpoint, "webhook_endpoint.test", {"delivery": delivery.public_id})
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
    _audit(actor, delivery.endpoint, "webhook_delivery.redeliver", {"delivery": delivery.public_id})
    _deliver_on_commit([delivery.pk])
    return delivery


def _audit(actor: Actor, endpoint: WebhookEndpoint, action: str, data: dict[str, Any]) -> None:
    project = endpoint.project
    audit_record(
        actor=actor,
        organization=project.organization,
        project=project,
        action=action,
        target=endpoint.public_id,
        data=data,
    )


# --- the outbox --------------------------------------------------------------------------------


def enqueue_event(event) -> list[WebhookDelivery]:
    """Write the outbox rows for a just-recorded JobEvent (call inside its transaction).

    One delivery per enabled endpoint of the job's project subscribed to ``event.type``; event
    types outside ``WEBHOOK_EVENT_TYPES`` send nothing. ``data`` is the Job object as it is now
    for ``job.*`` events, and ``{"job_id", "checkpoint_id", "step", "download_url"}`` for
    ``checkpoint.ready``. Returns the deliveries created (none when nobody listens).
    """
    if event.type not in WEBHOOK_EVENT_TYPES:
        return []
    job = event.job
    endpoints = [
        endpoint
        for endpoint in WebhookEndpoint.objects.filter(project_id=job.project_id, enabled=True).order_by("pk")
        if event.type in endpoint.events
    ]
    if not endpoints:
        return []
    if event.type == "checkpoint.ready":
        checkpoint_id = event.data.get("checkpoint_id")
        data = {
            "job_id": job.public_id,
            "checkpoint_id": checkpoint_id,
            "step": event.data.get("step"),
            "download_url": f"{settings.LAB_PUBLIC_URL}/api/v1/checkpoints/{checkpoint_id}/download",
        }
    else:
        from jobs.serializers import job_to_dict

        data = job_to_dict(job)
    return _publish(
        project_id=job.project_id,
        type=event.type,
        data=data,
        endpoints=endpoints,
        created_at=event.created_at,
        public_id=event.public_id,
        job_event=event,
    )


def _publish(
    *,
    project_id: int,
    type: str,
    data: dict[str, Any],
    endpoints: list[WebhookEndpoint],
    created_at: datetime,
    public_id: str | None = None,
    job_event=None,
    now: datetime | None = None,
) -> list[WebhookDelivery]:
    """Store one message and a delivery per endpoint; queue their delivery on commit."""
    now = now or timezone.now()
    message = WebhookMessage(project_id=project_id, type=type, created_at=created_at, job_event=job_event)
    if public_id:
        message.public_id = public_id
    body = {"id": message.public_id, "type": type, "created_at": iso(created_at), "data": data}
    # ASCII-only JSON (non-ASCII as \u escapes): any string, even a lone surrogate, stores and signs.
    message.body = json.dumps(body, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=True)
    message.save()
    first_delay = timedelta(seconds=_schedule()[0])
    deliveries = WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(message=message, endpoint=endpoint, next_attempt_at=now + first_delay, created_at=now)
            for endpoint in endpoints
        ]
    )
    _deliver_on_commit([delivery.pk for delivery in deliveries], countdown=first_delay.total_seconds())
    return deliveries


_pending = threading.local()


def _deliver_on_commit(delivery_ids: list[int], countdown: float = 0) -> None:
    """Queue delivery tasks for ``delivery_ids`` once the current transaction commits.

    Ids written by one transaction are gathered and sent in tasks of ``BATCH_SIZE``, so a burst
    of events (or an event to many endpoints) costs few tasks. Every call registers a flush; the
    first one to run after a commit sends everything gathered so far and the rest find nothing.
    Ids left over from a rolled-back transaction go out with the next flush and are skipped by
    the claim (no such row).
    """
    gathered = getattr(_pending, "ids", None)
    if gathered is None:
        gathered = _pending.ids = []
    gathered.extend((delivery_id, countdown) for delivery_id in delivery_ids)
    transaction.on_commit(_flush_pending)


def _flush_pending() -> None:
    from jobs.webhooks import tasks

    gathered = getattr(_pending, "ids", None)
    if not gathered:
        return
    _pending.ids = []
    by_countdown: dict[float, list[int]] = defaultdict(list)
    for delivery_id, countdown in gathered:
        by_countdown[countdown].append(delivery_id)
    for countdown, ids in by_countdown.items():
        for start in range(0, len(ids), BATCH_SIZE):
            chunk = ids[start : start + BATCH_SIZE]
            if countdown > 0:
                tasks.deliver.apply_async((chunk,), countdown=countdown)
            else:
                tasks.deliver.delay(chunk)


def _schedule() -> list[int]:
    schedule = list(settings.LAB_WEBHOOK_RETRY_SCHEDULE) or [0]
    return schedule


def retry_delay(attempts_made: int) -> float | None:
    """Return seconds to wait before the next try after ``attempts_made`` tries, or None when done.

    The n-th entry of ``LAB_WEBHOOK_RETRY_SCHEDULE`` is the wait before try n+1 (entry 0 before
    the first); the wait gets ±10 % jitter so retries of many deliveries spread out.
    """
    schedule = _schedule()
    if attempts_made >= len(schedule):
        return None
    return schedule[attempts_made] * random.uniform(0.9, 1.1)


# --- delivery ----------------------------------------------------------------------------------


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
            _executor = ThreadPoolExecutor(max_workers=BATCH_SIZE, thread_name_prefix="webhook")
        return _executor


def signature_headers(
    delivery: WebhookDelivery, *, timestamp: int | None = None, now: datetime | None = None
) -> dict[str, str]:
    """Return the request headers of one try: content type and the three Standard Webhooks headers.

    ``timestamp`` (Unix seconds) defaults to the real current time.
    """
    timestamp = int(time.time()) if timestamp is None else timestamp
    moment = datetime.fromtimestamp(timestamp, tz=dt_timezone.utc)
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
    delivery_ids: list[int] | None, *, now: datetime, limit: int = BATCH_SIZE
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
        return DeliveryResult(delivery.pk, False, True, None, error, exc.duration_ms), ""
    except Exception as exc:  # never lose the bookkeeping of the others over one bad try
        logger.exception("webhook try crashed", extra={"delivery": delivery.public_id})
        return DeliveryResult(delivery.pk, False, True, None, f"internal error: {type(exc).__name__}", 0), ""
    code = response.status_code
    succeeded = 200 <= code < 300
    retryable = code == 429 or code >= 500
    error = "" if succeeded else f"HTTP {code}"
    return DeliveryResult(delivery.pk, succeeded, retryable, code, error, response.duration_ms), response.excerpt


def deliver(
    delivery_ids: list[int] | None, *, now: datetime | None = None, limit: int = BATCH_SIZE
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
            delay = retry_delay(delivery.attempt_count) if result.retryable else None
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
            WebhookEndpoint.objects.filter(pk__in=recovered_endpoints).update(failing_since=None)
        for endpoint_id, endpoint in failed_endpoints.items():
            if endpoint_id in recovered_endpoints or endpoint_id in unsendable_endpoints:
                continue
            _note_failure(endpoint, now=now)
        for endpoint in unsendable_endpoints.values():
            # Retrying cannot help: the URL is refused before any network use.
            endpoint_disable(endpoint=endpoint, reason="invalid_url", now=now)
        for delivery_id, delay in retry_soon:
            _deliver_on_commit([delivery_id], countdown=delay)


def _note_failure(endpoint: WebhookEndpoint, *, now: datetime) -> None:
    """Start the endpoint's failure clock, or disable it when it has run for ``DISABLE_AFTER``."""
    if endpoint.failing_since is None:
        WebhookEndpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(failing_since=now)
        return
    if now - endpoint.failing_since < DISABLE_AFTER:
        return
    endpoint_disable(endpoint=endpoint, reason="failing_for_5_days", now=now)


def endpoint_disable(*, endpoint: WebhookEndpoint, reason: str, now: datetime | None = None) -> bool:
    """Disable an endpoint Lab gave up on; fail its pending deliveries; send ``webhook_endpoint.disabled``.

    The event goes to the project's other enabled endpoints subscribed to it (the disabled one
    cannot hear it); its ``data`` is the endpoint object. Returns False when it was already disabled.
    """
    now = now or timezone.now()
    with transaction.atomic():
        changed = WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
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
            action="webhook_endpoint.disable",
            target=endpoint.public_id,
            data={"reason": reason},
        )
        listeners = [
            other
            for other in WebhookEndpoint.objects.filter(project_id=endpoint.project_id, enabled=True).order_by("pk")
            if "webhook_endpoint.disabled" in other.events
        ]
        if listeners:
            _publish(
                project_id=endpoint.project_id,
                type="webhook_endpoint.disabled",
                data=endpoint_to_dict(endpoint),
                endpoints=listeners,
                created_at=now,
                now=now,
            )
    logger.warning("webhook endpoint disabled", extra={"endpoint": endpoint.public_id, "reason": reason})
    return True


def sweep(*, now: datetime | None = None, limit: int = 5000) -> int:
    """Queue delivery tasks for deliveries that are due (retries, expired leases); return how many.

    Deliveries due for less than ``SWEEP_GRACE`` are left to the task queued when they were.
    """
    now = now or timezone.now()
    ids = list(
        WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING, next_attempt_at__lte=now - SWEEP_GRACE, endpoint__enabled=True
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    from jobs.webhooks import tasks

    for start in range(0, len(ids), BATCH_SIZE):
        tasks.deliver.delay(ids[start : start + BATCH_SIZE])
    if cache.add("webhooks:purge", 1, timeout=PURGE_INTERVAL_S):
        purge_finished(now=now)
    return len(ids)


def purge_finished(*, now: datetime | None = None, limit: int = 5000) -> int:
    """Delete messages older than ``KEEP_DELIVERIES_FOR`` with no pending delivery; return how many.

    Their deliveries and attempts go with them. At most ``limit`` messages per call, oldest first.
    """
    cutoff = (now or timezone.now()) - KEEP_DELIVERIES_FOR
    ids = list(
        WebhookMessage.objects.filter(created_at__lt=cutoff)
        .exclude(deliveries__status=DeliveryStatus.PENDING)
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    )
    if ids:
        WebhookMessage.objects.filter(pk__in=ids).delete()
    return len(ids)


__all__ = [
    "MAX_URL_LENGTH",
    "WEBHOOK_EVENT_TYPES",
    "claim_deliveries",
    "deliver",
    "delivery_redeliver",
    "endpoint_create",
    "endpoint_delete",
    "endpoint_disable",
    "endpoint_rotate_secret",
    "endpoint_send_test",
    "endpoint_update",
    "enqueue_event",
    "purge_finished",
    "retry_delay",
    "sweep",
]
