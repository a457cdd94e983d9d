"""Invoiced usage to Stripe: one Billing meter event per ledger interval, never sent twice.

An interval closed while its organization was invoiced (and billing on) is owed to Stripe as a
meter event of ``STRIPE_METER_EVENT_NAME`` whose ``identifier`` is the interval's public id and
whose value is its GPU-seconds (CPU-seconds for a CPU job), rounded half-up to whole seconds.
``meter_events_send`` claims each owed interval with a ``MeterEvent`` marker row (unique per
interval) before the request and marks it ``sent`` after Stripe's answer: a sent interval is never
sent again; a marker left ``sending`` by a crash is resent under the same identifier, which Stripe
dedupes for 24 hours. Prepaid intervals are never sent.
"""

from __future__ import annotations

import logging
from decimal import ROUND_HALF_UP, Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import stripe_api
from billing.accounts import billing_enabled
from billing.models import BillingAccount, MeterEvent, MeterEventState, Plan, UsageInterval

logger = logging.getLogger(__name__)

#: Intervals sent by one run of the task (the task re-enqueues itself while more are owed).
BATCH = 500


def meter_value(interval: UsageInterval) -> int:
    """Return the meter event value of ``interval``: its GPU-seconds, or CPU-seconds, whole."""
    seconds = interval.gpu_seconds if interval.gpu_seconds else interval.cpu_seconds
    return int(Decimal(seconds).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def owed_intervals(limit: int = BATCH) -> list[UsageInterval]:
    """Return invoiced intervals whose meter event Stripe has not accepted yet, oldest first."""
    return list(
        UsageInterval.objects.unscoped()
        .filter(plan=Plan.INVOICED, billing_enabled=True)
        .exclude(meter_event__state=MeterEventState.SENT)
        .order_by("id")[:limit]
    )


def _claim(interval: UsageInterval) -> MeterEvent | None:
    """Return the interval's marker row, created ``sending`` if new; None when already sent."""
    try:
        with transaction.atomic():
            return MeterEvent.objects.create(interval=interval, value=meter_value(interval))
    except IntegrityError:
        marker = MeterEvent.objects.get(interval=interval)
        return None if marker.state == MeterEventState.SENT else marker


def meter_events_send(*, limit: int = BATCH) -> int:
    """Send the owed meter events, oldest first; return how many Stripe accepted.

    Stops at the first Stripe error and raises it (``stripe.StripeError``), so the caller retries
    later; what was accepted before stays marked sent. Does nothing when billing is off.
    """
    if not billing_enabled():
        return 0
    customers = {}
    sent = 0
    for interval in owed_intervals(limit):
        marker = _claim(interval)
        if marker is None:
            continue
        if interval.organization_id not in customers:
            account = BillingAccount.objects.filter(organization_id=interval.organization_id).first()
            customers[interval.organization_id] = account.stripe_customer_id if account else ""
        customer = customers[interval.organization_id]
        if not customer:
            logger.warning("an invoiced interval has no Stripe customer", extra={"interval": interval.public_id})
            continue
        MeterEvent.objects.filter(pk=marker.pk).update(attempts=marker.attempts + 1)
        stripe_api.meter_event_send(
            customer_id=customer,
            identifier=interval.public_id,
            value=marker.value,
            timestamp=int(interval.ended_at.timestamp()),
        )
        MeterEvent.objects.filter(pk=marker.pk).update(state=MeterEventState.SENT, sent_at=timezone.now())
        sent += 1
    return sent


def enqueue_meter_events() -> None:
    """Send owed meter events from a Celery task once the current transaction commits."""
    from billing import tasks

    transaction.on_commit(tasks.send_meter_events.delay)
