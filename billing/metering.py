"""Invoiced usage to Stripe: one Billing meter event per ledger interval, never sent twice.

An interval closed while its organization was invoiced (and billing on) is owed to Stripe as a
meter event of ``STRIPE_METER_EVENT_NAME`` whose ``identifier`` is the interval's public id and
whose value is its GPU-seconds (CPU-seconds for a CPU job), rounded half-up to whole seconds.
Prepaid intervals are never sent, nor those of sandboxes (``METERED_TO_STRIPE``).

``meter_events_send`` keeps one ``MeterEvent`` marker row per interval (unique):

1. it claims the marker for ``CLAIM_LEASE`` with a conditional update (created claimed when new),
   so two runs at once never send the same interval; a claim outlives only a run that died;
2. it records the time of the first request (``requested_at``) before that request leaves;
3. it marks the marker ``sent`` after Stripe's answer: a sent interval is never sent again.

Stripe enforces an identifier's uniqueness "within a rolling period of at least 24 hours"
(https://docs.stripe.com/api/billing/meter-event/create). A marker left ``sending`` (Stripe
refused or was unreachable, or Lab died between Stripe's answer and step 3) is sent again under
the same identifier once its claim has lapsed, but only while its first request is less than
``RESEND_WINDOW`` old, inside that period; past it Stripe would count a resend again, so the
marker becomes ``unconfirmed``, is logged as an error, and waits for an operator
(``meter_event_resolve``) instead.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing import stripe_api
from billing.accounts import billing_enabled
from billing.models import BillingAccount, Meter, MeterEvent, MeterEventState, Plan, UsageInterval
from lab.celery import TaskName
from lab.dispatch import enqueue_on_commit

logger = logging.getLogger(__name__)

#: Intervals sent by one run of the task (the task re-enqueues itself while more are owed).
BATCH = 500
#: How long a run holds a claimed marker: longer than the task's hard time limit (180 s,
#: billing.tasks), so only a run that died leaves a claim to lapse.
CLAIM_LEASE = timedelta(minutes=5)
#: How long after its first request a marker may still be resent under its identifier: Stripe
#: dedupes for at least 24 hours; an hour is left for clock skew and the request's own time.
RESEND_WINDOW = timedelta(hours=23)
#: The ledger's meters whose intervals go to the GPU-seconds meter: job attempts and dedicated
#: inference servers. A sandbox's CPU- and memory-seconds are not sent (no meter holds them yet).
METERED_TO_STRIPE = (Meter.ATTEMPT, Meter.SERVER)


def meter_value(interval: UsageInterval) -> int:
    """Return the meter event value of ``interval``: its GPU-seconds, or CPU-seconds, whole."""
    seconds = interval.gpu_seconds if interval.gpu_seconds else interval.cpu_seconds
    return int(Decimal(seconds).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def owed_intervals(limit: int = BATCH) -> list[UsageInterval]:
    """Return invoiced intervals whose meter event is still owed (neither sent nor unconfirmed),
    oldest first."""
    return list(
        UsageInterval.objects.unscoped()
        .filter(plan=Plan.INVOICED, billing_enabled=True, meter__in=METERED_TO_STRIPE)
        .exclude(meter_event__state__in=[MeterEventState.SENT, MeterEventState.UNCONFIRMED])
        .order_by("id")[:limit]
    )


def _claim(interval: UsageInterval, now) -> MeterEvent | None:
    """Return the interval's marker claimed by this run until ``now + CLAIM_LEASE`` (created if
    new); None when it is sent, unconfirmed, or claimed by another run."""
    try:
        with transaction.atomic():
            return MeterEvent.objects.create(interval=interval, value=meter_value(interval), claimed_until=now + CLAIM_LEASE)
    except IntegrityError:
        pass
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    claimed = MeterEvent.objects.filter(free, interval=interval, state=MeterEventState.SENDING).update(
        claimed_until=now + CLAIM_LEASE
    )
    return MeterEvent.objects.get(interval=interval) if claimed else None


def _unconfirm(marker: MeterEvent, interval: UsageInterval) -> None:
    """Set aside a marker whose first request is past the resend window, for an operator."""
    MeterEvent.objects.filter(pk=marker.pk, state=MeterEventState.SENDING).update(
        state=MeterEventState.UNCONFIRMED, claimed_until=None
    )
    logger.error(
        "a meter event was requested more than the resend window ago without Stripe's answer; "
        "check Stripe and resolve it (billing.metering.meter_event_resolve)",
        extra={"interval": interval.public_id, "requested_at": marker.requested_at.isoformat()},
    )


def meter_events_send(*, limit: int = BATCH) -> int:
    """Send the owed meter events, oldest first; return how many Stripe accepted.

    Stops at the first Stripe error and raises it (``stripe.StripeError``), so the caller retries
    later; what was accepted before stays marked sent, and the failed one is free to be claimed
    again at once. Does nothing when billing is off.
    """
    if not billing_enabled():
        return 0
    customers = {}
    sent = 0
    for interval in owed_intervals(limit):
        if interval.organization_id not in customers:
            account = BillingAccount.objects.filter(organization_id=interval.organization_id).first()
            customers[interval.organization_id] = account.stripe_customer_id if account else ""
        customer = customers[interval.organization_id]
        if not customer:
            logger.warning("an invoiced interval has no Stripe customer", extra={"interval": interval.public_id})
            continue
        now = timezone.now()
        marker = _claim(interval, now)
        if marker is None:
            continue
        if marker.requested_at is not None and now - marker.requested_at > RESEND_WINDOW:
            _unconfirm(marker, interval)
            continue
        # Recorded before the request leaves: a crash after it still starts the window.
        MeterEvent.objects.filter(pk=marker.pk).update(attempts=F("attempts") + 1, requested_at=Coalesce("requested_at", now))
        try:
            stripe_api.meter_event_send(
                customer_id=customer,
                identifier=interval.public_id,
                value=marker.value,
                timestamp=int(interval.ended_at.timestamp()),
            )
        except Exception:
            MeterEvent.objects.filter(pk=marker.pk).update(claimed_until=None)
            raise
        MeterEvent.objects.filter(pk=marker.pk).update(state=MeterEventState.SENT, sent_at=timezone.now(), claimed_until=None)
        sent += 1
    return sent


def unconfirmed_meter_events() -> list[MeterEvent]:
    """Return the markers waiting for an operator (``unconfirmed``), oldest first, with their interval."""
    return list(MeterEvent.objects.filter(state=MeterEventState.UNCONFIRMED).select_related("interval").order_by("id"))


def meter_event_resolve(*, interval_public_id: str, stripe_has_it: bool) -> MeterEvent:
    """Resolve an ``unconfirmed`` marker once an operator has checked Stripe (the meter's event
    summaries for the customer around the interval's end): ``stripe_has_it`` marks it sent;
    otherwise it is owed again as never requested, and the next run sends it under the same
    identifier.

    Raises ``MeterEvent.DoesNotExist`` when the interval has no unconfirmed marker.
    """
    marker = MeterEvent.objects.get(interval__public_id=interval_public_id, state=MeterEventState.UNCONFIRMED)
    if stripe_has_it:
        MeterEvent.objects.filter(pk=marker.pk).update(state=MeterEventState.SENT, sent_at=timezone.now())
    else:
        MeterEvent.objects.filter(pk=marker.pk).update(state=MeterEventState.SENDING, requested_at=None, claimed_until=None)
    marker.refresh_from_db()
    return marker


def enqueue_meter_events() -> None:
    """Send owed meter events from a Celery task once the current transaction commits."""
    enqueue_on_commit(TaskName.SEND_METER_EVENTS)
