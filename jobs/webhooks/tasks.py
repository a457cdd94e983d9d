"""Celery tasks of the webhook outbox: thin, idempotent adapters over ``jobs.webhooks.delivery`` and
``jobs.webhooks.sweep``."""

from __future__ import annotations

from celery import shared_task

from lab.celery import Queue


@shared_task(name="jobs.webhooks.deliver", queue=Queue.WEBHOOKS, soft_time_limit=100, time_limit=120)
def deliver(delivery_ids: list[int]) -> int:
    """Send the given deliveries that are still due (a no-op for ones already sent); return how many were tried."""
    from jobs.webhooks.delivery import deliver as deliver_now

    return len(deliver_now(delivery_ids))


@shared_task(name="jobs.webhooks.sweep", queue=Queue.WEBHOOKS, soft_time_limit=60, time_limit=90)
def sweep() -> int:
    """Periodic: queue every delivery whose retry is due or whose worker died; return how many."""
    from jobs.webhooks.sweep import sweep as sweep_now

    return sweep_now()
