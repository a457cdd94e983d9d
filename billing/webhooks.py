"""Stripe's webhooks at ``POST /billing/stripe/webhook``: verify, check, dedupe, apply.

Each request is verified on its raw body with ``STRIPE_WEBHOOK_SECRET`` (``Stripe-Signature``:
``t=`` within 5 minutes of now either way, ``v1=`` HMAC-SHA256 of ``t.payload``; anything else,
and a body nested deeper than ``lab.lib.jsonbounds.MAX_JSON_DEPTH``, is 400), its
``api_version`` must be the one Lab pins (else 400, logged, nothing applied), and only the types
of ``HANDLERS`` are applied (others are answered 200 and ignored). An event id is processed once:
its ``StripeEvent`` row is written in the same transaction as what it changes, under a unique
constraint. Stripe does not deliver in order, so state set from events (the subscription, the
payment status) remembers the time of the event that set it, and an older event is not applied:
a ``customer.subscription.created`` arriving after its ``deleted`` changes nothing, nor does an
``invoice.payment_failed`` arriving after the ``invoice.paid`` that settled it. ``created`` counts
whole seconds, so two events may tie: a paid invoice wins the tie (a failure of the same second is
not applied after it, and a payment of the same second clears a failure).
Reference: https://docs.stripe.com/webhooks (signatures, retries, ordering, event types).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import stripe
from django.db import IntegrityError, transaction

from billing import stripe_api
from billing.accounts import credit_add
from billing.checkout import MAX_PURCHASE_USD
from billing.models import BillingAccount, CreditKind, Plan, StripeEvent
from lab.models import Organization

logger = logging.getLogger(__name__)

#: Subscription statuses under which an organization is invoiced.
INVOICED_STATUSES = frozenset({"active", "trialing", "past_due", "incomplete"})
#: The most credit one Checkout session can carry, in cents (what Lab's Checkout sells at most).
MAX_CREDIT_CENTS = int(MAX_PURCHASE_USD * 100)
_CENTS = re.compile(r"[0-9]{1,10}")


def _stripe_id(value: Any, max_length: int) -> str | None:
    """Return ``value`` if it can be a Stripe id stored in a column of ``max_length``: a string of
    1 to ``max_length`` printable ASCII characters (Stripe's ids are ``evt_...``, ``cs_...``)."""
    if isinstance(value, str) and 0 < len(value) <= max_length and value.isascii() and value.isprintable():
        return value
    return None


class WebhookRefused(Exception):
    """A webhook request Lab refuses with 400 (bad signature, stale, wrong API version, not JSON)."""


@dataclass(frozen=True)
class WebhookResult:
    """What happened to one event: ``applied``, ``ignored`` or ``duplicate``."""

    event_id: str
    type: str
    outcome: str


def _moment(event: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(int(event["created"]), tz=timezone.utc)


def _account_by_customer(customer_id: Any) -> BillingAccount | None:
    if not isinstance(customer_id, str) or not customer_id:
        return None
    account = BillingAccount.objects.filter(stripe_customer_id=customer_id).first()
    return BillingAccount.objects.select_for_update().get(pk=account.pk) if account else None


def _checkout_completed(event: dict[str, Any], session: dict[str, Any]) -> bool:
    """Add the credit a paid Checkout session bought, once per session."""
    if session.get("payment_status") != "paid" or session.get("mode", "payment") != "payment":
        return False
    session_id = _stripe_id(session.get("id"), 200)
    organization = Organization.objects.filter(public_id=str(session.get("client_reference_id") or "")).first()
    metadata = session.get("metadata") if isinstance(session.get("metadata"), dict) else {}
    # Lab's own Checkout writes credit_cents as a string of digits (billing.checkout); anything else is not its session.
    raw_cents = metadata.get("credit_cents")
    cents = int(raw_cents) if isinstance(raw_cents, str) and _CENTS.fullmatch(raw_cents) else 0
    if organization is None or session_id is None or not 0 < cents <= MAX_CREDIT_CENTS:
        logger.warning("checkout session without a Lab organization or credit", extra={"session": session_id})
        return False
    return credit_add(
        organization_id=organization.pk, amount_micro_usd=cents * 10_000, kind=CreditKind.PURCHASE, reference=session_id
    )


def _payment_status(event: dict[str, Any], invoice: dict[str, Any], *, failed: bool) -> bool:
    """Set or clear the account's payment_failed flag, unless a newer invoice event already did,
    or a paid invoice of the same second (``created`` is in whole seconds: the payment wins)."""
    account = _account_by_customer(invoice.get("customer"))
    moment = _moment(event)
    if account is None:
        return False
    last = account.payment_status_updated_at
    if last is not None and (moment < last or (moment == last and failed and not account.payment_failed)):
        return False
    account.payment_failed, account.payment_status_updated_at = failed, moment
    account.save(update_fields=["payment_failed", "payment_status_updated_at"])
    return True


def _subscription(event: dict[str, Any], subscription: dict[str, Any]) -> bool:
    """Follow the subscription's status: invoiced while it is live, prepaid once it is deleted."""
    account = _account_by_customer(subscription.get("customer"))
    moment = _moment(event)
    deleted = event["type"] == "customer.subscription.deleted"
    subscription_id = _stripe_id(subscription.get("id"), 64)
    raw_status = subscription.get("status", "")
    if account is None or subscription_id is None or not (isinstance(raw_status, str) and len(raw_status) <= 32):
        return False
    if account.subscription_updated_at and (
        moment < account.subscription_updated_at
        or (moment == account.subscription_updated_at and account.subscription_status == "canceled" and not deleted)
    ):
        return False  # older news than what the account shows
    status = "canceled" if deleted else raw_status
    account.stripe_subscription_id = subscription_id
    account.subscription_status = status
    account.subscription_updated_at = moment
    account.plan = Plan.INVOICED if status in INVOICED_STATUSES else Plan.PREPAID
    account.save(update_fields=["stripe_subscription_id", "subscription_status", "subscription_updated_at", "plan"])
    return True


HANDLERS = {
    "checkout.session.completed": _checkout_completed,
    "invoice.paid": lambda event, invoice: _payment_status(event, invoice, failed=False),
    "invoice.payment_failed": lambda event, invoice: _payment_status(event, invoice, failed=True),
    "customer.subscription.created": _subscription,
    "customer.subscription.updated": _subscription,
    "customer.subscription.deleted": _subscription,
}


def stripe_webhook_receive(*, payload: bytes, signature_header: str) -> WebhookResult:
    """Verify and apply one Stripe webhook request (see the module docstring).

    Raises WebhookRefused (answered 400) for a missing, forged or stale signature, a body that is
    not a Stripe event, or an ``api_version`` other than ``billing.stripe_api.api_version()``.
    """
    try:
        event = stripe_api.webhook_event(payload, signature_header)
    except (stripe.SignatureVerificationError, UnicodeDecodeError, ValueError) as exc:
        raise WebhookRefused(f"Invalid Stripe signature or body: {exc}") from None
    if not isinstance(event, dict) or _stripe_id(event.get("id"), 255) is None or _stripe_id(event.get("type"), 100) is None:
        raise WebhookRefused("The body is not a Stripe event.")
    if event.get("api_version") != stripe_api.api_version():
        logger.error(
            "Stripe event with another API version refused",
            extra={"event": event["id"], "api_version": event.get("api_version"), "expected": stripe_api.api_version()},
        )
        raise WebhookRefused(f"api_version {event.get('api_version')!r} is not {stripe_api.api_version()!r}.")
    handler = HANDLERS.get(event["type"])
    if handler is None:
        return WebhookResult(event["id"], event["type"], "ignored")
    obj = (event.get("data") or {}).get("object") if isinstance(event.get("data"), dict) else None
    created = event.get("created")
    if not isinstance(obj, dict) or not isinstance(created, int) or isinstance(created, bool) or not 0 < created < 2**33:
        raise WebhookRefused("The event has no data.object or created time.")
    try:
        with transaction.atomic():
            StripeEvent.objects.create(event_id=event["id"], type=event["type"], created=_moment(event), outcome="")
            outcome = "applied" if handler(event, obj) else "ignored"
            StripeEvent.objects.filter(event_id=event["id"]).update(outcome=outcome)
    except IntegrityError:
        return WebhookResult(event["id"], event["type"], "duplicate")
    return WebhookResult(event["id"], event["type"], outcome)
