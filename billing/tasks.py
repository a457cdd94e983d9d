"""Celery tasks of billing: thin adapters over ``billing.metering``.

Imported by the worker and beat only (``lab.celery``); producers send these by ``TaskName``
through ``billing.metering.enqueue_meter_events``.
"""

from __future__ import annotations

import stripe

from billing import metering
from lab import dispatch
from lab.celery import TaskName, task


@task(
    TaskName.SEND_METER_EVENTS,
    bind=True,
    soft_time_limit=120,
    time_limit=180,
    autoretry_for=(stripe.StripeError,),
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=None,
)
def send_meter_events(self) -> int:
    """Send owed Stripe meter events; a Stripe error retries with exponential backoff (5 s to
    10 min); a full batch enqueues the next one. Returns how many were accepted."""
    sent = metering.meter_events_send()
    if sent >= metering.BATCH:
        dispatch.send(TaskName.SEND_METER_EVENTS)
    return sent
