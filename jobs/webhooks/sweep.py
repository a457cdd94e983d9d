"""The periodic webhook sweep: queue deliveries that are due and purge old finished ones.

Retries due later than ``jobs.webhooks.delivery.COUNTDOWN_LIMIT_S`` and deliveries whose worker
died (their lease ran out) have no task waiting for them; ``sweep`` (Celery beat runs it every
5 s) queues them. Finished messages are kept ``KEEP_DELIVERIES_FOR`` for the
dashboard and the deliveries API, then deleted with their deliveries and attempts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.cache import cache
from django.utils import timezone

from jobs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookMessage
from jobs.webhooks.outbox import BATCH_SIZE
from lab import dispatch
from lab.celery import TaskName

#: The sweep leaves deliveries due less than this long to the task already queued for them, so a
#: short backlog in the queue does not get every pending delivery queued a second time.
SWEEP_GRACE = timedelta(seconds=15)
#: Finished deliveries (and their messages and attempts) are kept this long for the dashboard.
KEEP_DELIVERIES_FOR = timedelta(days=30)
#: The sweep purges old deliveries at most this often.
PURGE_INTERVAL_S = 600


def sweep(*, now: datetime | None = None, limit: int = 5000) -> int:
    """Queue delivery tasks for deliveries that are due (retries, expired leases); return how many.

    Deliveries due for less than ``SWEEP_GRACE`` are left to the task queued when they were.
    At most ``limit`` deliveries per call, the longest due first; purges old ones every
    ``PURGE_INTERVAL_S`` at most.
    """
    now = now or timezone.now()
    ids = list(
        WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING, next_attempt_at__lte=now - SWEEP_GRACE, endpoint__enabled=True
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    for start in range(0, len(ids), BATCH_SIZE):
        dispatch.send(TaskName.DELIVER_WEBHOOKS, ids[start : start + BATCH_SIZE])
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
