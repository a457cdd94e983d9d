"""Celery tasks of the webhook outbox: thin, idempotent adapters over ``jobs.webhooks.delivery`` and
``jobs.webhooks.sweep``.

Imported by the worker and beat only (``lab.celery`` autodiscovers ``jobs.webhooks``); the outbox
and the sweep send ``TaskName.DELIVER_WEBHOOKS`` by name through ``lab.dispatch``.
"""

from __future__ import annotations

from jobs.webhooks import delivery
from jobs.webhooks import sweep as sweeping
from lab.celery import TaskName, task


@task(TaskName.DELIVER_WEBHOOKS, soft_time_limit=100, time_limit=120)
def deliver(delivery_ids: list[int]) -> int:
    """Send the given deliveries that are still due (a no-op for ones already sent); return how many were tried."""
    return len(delivery.deliver(delivery_ids))


@task(TaskName.SWEEP_WEBHOOKS, soft_time_limit=60, time_limit=90)
def sweep() -> int:
    """Periodic: queue every delivery whose retry is due or whose worker died; return how many."""
    return sweeping.sweep()
