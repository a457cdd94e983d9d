"""Celery tasks of billing: thin adapters over ``billing.metering``."""

from __future__ import annotations

import stripe
from celery import shared_task

from lab.celery import Queue


@shared_task(
    bind=True,
    name="billing.send_meter_events",
    queue=Queue.BILLING,
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
    from billing.metering import BATCH, meter_events_send

    sent = meter_events_send()
    if sent >= BATCH:
        send_meter_events.delay()
    return sent
