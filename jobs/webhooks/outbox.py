"""The webhook outbox: one message per event, one delivery row per endpoint, queued on commit.

The outbox takes finished payloads: ``jobs.events`` asks for the ``subscribed_endpoints`` of an
event and, inside the transaction that records the JobEvent, hands ``publish`` its ``data``, so the
delivery rows exist exactly when the event does. ``publish`` stores the message (its body is the
Standard Webhooks payload ``{"id": "evt_...", "type": "...", "created_at": "<ISO 8601>", "data":
{...}}``, signed at each try by ``jobs.webhooks.delivery``) and ``deliver_on_commit`` queues the
delivery task once the transaction commits, in batches of ``BATCH_SIZE``.

When deliveries are due comes from ``LAB_WEBHOOK_RETRY_SCHEDULE`` (Svix's schedule by default:
0 s, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; see https://docs.svix.com/retries): the first
entry is the wait before the first try, ``retry_delay`` gives the others with ±10 % jitter.
"""

from __future__ import annotations

import json
import random
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from jobs.read_once import ReadOnce
from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from jobs.webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookMessage
from lab import dispatch
from lab.formats import iso
from lab.celery import TaskName

#: Deliveries handed to one task (sent concurrently by one worker process).
BATCH_SIZE = 25


def subscribed_endpoints(*, project_id: int, type: str) -> list[WebhookEndpoint]:
    """Return the enabled endpoints of ``project_id`` subscribed to events of ``type``, in pk
    order; none for a type outside ``WEBHOOK_EVENT_TYPES``."""
    if type not in WEBHOOK_EVENT_TYPES:
        return []
    return [endpoint for endpoint in _enabled_endpoints(project_id) if type in endpoint.events]


#: The endpoints ``endpoints_read_once`` read, by project id.
_ENDPOINTS: ReadOnce[int, list[WebhookEndpoint]] = ReadOnce()


@contextmanager
def endpoints_read_once(project_ids: Iterable[int]) -> Iterator[None]:
    """Read the enabled endpoints of ``project_ids`` in one query, for every event of their jobs
    recorded inside the block (which would otherwise read them once per event): for a caller
    that records events for many jobs in one transaction that changes no endpoint (the
    reconciler finishing a batch of jobs)."""
    endpoints: dict[int, list[WebhookEndpoint]] = {project_id: [] for project_id in project_ids}
    for endpoint in WebhookEndpoint.objects.filter(project_id__in=endpoints, enabled=True).order_by("pk"):
        endpoints[endpoint.project_id].append(endpoint)
    with _ENDPOINTS.holding(endpoints):
        yield


def _enabled_endpoints(project_id: int) -> list[WebhookEndpoint]:
    """Return the enabled endpoints of ``project_id`` in pk order (as ``endpoints_read_once`` read
    them, inside its block)."""
    held = _ENDPOINTS.values()
    if project_id in held:
        return held[project_id]
    return list(WebhookEndpoint.objects.filter(project_id=project_id, enabled=True).order_by("pk"))


def publish(
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
    """Store one message and a delivery per endpoint; queue their delivery on commit.

    ``public_id`` is the message's ``evt_...`` id (a JobEvent's own, for job events; a new one
    when None); the first try is due the schedule's first entry after ``now``. Returns the
    deliveries, in the order of ``endpoints``.
    """
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
    deliver_on_commit([delivery.pk for delivery in deliveries], countdown=first_delay.total_seconds())
    return deliveries


_pending = threading.local()


def deliver_on_commit(delivery_ids: list[int], countdown: float = 0) -> None:
    """Queue delivery tasks for ``delivery_ids`` once the current transaction commits.

    ``countdown`` is the seconds the tasks wait in the queue. Ids written by one transaction are
    gathered and sent in tasks of ``BATCH_SIZE``, so a burst of events (or an event to many
    endpoints) costs few tasks. Every call registers a flush; the first one to run after a
    commit sends everything gathered so far and the rest find nothing. Ids left over from a
    rolled-back transaction go out with the next flush and are skipped by the claim (no such row).
    """
    gathered = getattr(_pending, "ids", None)
    if gathered is None:
        gathered = _pending.ids = []
    gathered.extend((delivery_id, countdown) for delivery_id in delivery_ids)
    transaction.on_commit(_flush_pending)


def _flush_pending() -> None:
    gathered = getattr(_pending, "ids", None)
    if not gathered:
        return
    _pending.ids = []
    by_countdown: dict[float, list[int]] = defaultdict(list)
    for delivery_id, countdown in gathered:
        by_countdown[countdown].append(delivery_id)
    for countdown, ids in by_countdown.items():
        wait = countdown if countdown > 0 else None
        for start in range(0, len(ids), BATCH_SIZE):
            dispatch.send(TaskName.DELIVER_WEBHOOKS, ids[start : start + BATCH_SIZE], countdown=wait)


def _schedule() -> list[int]:
    return list(settings.LAB_WEBHOOK_RETRY_SCHEDULE) or [0]


def retry_delay(attempts_made: int) -> float | None:
    """Return seconds to wait before the next try after ``attempts_made`` tries, or None when done.

    The n-th entry of ``LAB_WEBHOOK_RETRY_SCHEDULE`` is the wait before try n+1 (entry 0 before
    the first); the wait gets ±10 % jitter so retries of many deliveries spread out.
    """
    schedule = _schedule()
    if attempts_made >= len(schedule):
        return None
    return schedule[attempts_made] * random.uniform(0.9, 1.1)
