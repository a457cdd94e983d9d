"""Every call Lab makes to Stripe, through the official ``stripe`` client, API version pinned.

``STRIPE_API_VERSION`` overrides the pinned version and ``STRIPE_API_BASE`` the API's address
(stripe-mock or a local fake in tests). Nothing here runs unless billing is on (``STRIPE_API_KEY``);
callers check ``billing.accounts.billing_enabled`` first. Requests carry an ``Idempotency-Key``
where a retry could otherwise create a second object. Stripe's errors are raised as
``stripe.StripeError`` subclasses (the client retries network errors itself, twice).

Reference: https://docs.stripe.com/api (Checkout Sessions, Customer Portal sessions,
Subscriptions, Billing Meter Events) and https://docs.stripe.com/webhooks#verify-events.
"""

from __future__ import annotations

import time
from typing import Any

import stripe
from django.conf import settings

from billing.models import BillingAccount
from lab.lib.jsonbounds import json_loads

#: The Stripe API version Lab is written against (the one stripe==16.1.0 ships with).
PINNED_API_VERSION = "2026-10-28.endive"
#: A webhook whose signature timestamp is further than this (seconds) from now, either way, is refused.
WEBHOOK_TOLERANCE_S = 300


def api_version() -> str:
    """Return the Stripe API version in use: ``STRIPE_API_VERSION``, else the pinned one."""
    return settings.STRIPE_API_VERSION or PINNED_API_VERSION


def client() -> stripe.StripeClient:
    """Return a Stripe client for ``STRIPE_API_KEY`` at ``STRIPE_API_BASE`` (Stripe's by default)."""
    options: dict[str, Any] = {"stripe_version": api_version(), "max_network_retries": 2}
    if settings.STRIPE_API_BASE:
        options["base_addresses"] = {"api": settings.STRIPE_API_BASE.rstrip("/")}
    return stripe.StripeClient(settings.STRIPE_API_KEY, **options)


def ensure_customer(account: BillingAccount) -> str:
    """Return the account's Stripe customer id, creating the customer on first use (saved on
    ``account``; the caller holds its lock). The organization's public id is in its metadata."""
    if account.stripe_customer_id:
        return account.stripe_customer_id
    organization = account.organization
    customer = client().v1.customers.create(
        params={"name": organization.name, "metadata": {"organization": organization.public_id}},
        options={"idempotency_key": f"customer-{organization.public_id}"},
    )
    account.stripe_customer_id = customer.id
    BillingAccount.objects.filter(pk=account.pk).update(stripe_customer_id=customer.id)
    return customer.id


def checkout_session_create(*, customer_id: str, organization_public_id: str, amount_cents: int, success_url: str,
                            cancel_url: str) -> str:
    """Create a Checkout session that buys ``amount_cents`` of credit; return its URL.

    ``client_reference_id`` and ``metadata.organization`` carry the organization's public id,
    ``metadata.credit_cents`` the credit bought (docs/billing.md).
    """
    session = client().v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "customer": customer_id,
            "client_reference_id": organization_public_id,
            "metadata": {"organization": organization_public_id, "credit_cents": str(amount_cents)},
            "line_items": [
                {
                    "quantity": 1,
                    "price_data": {
                        "currency": "usd",
                        "unit_amount": amount_cents,
                        "product_data": {"name": "Lab compute credit"},
                    },
                }
            ],
            "success_url": success_url,
            "cancel_url": cancel_url,
        }
    )
    return session.url


def portal_session_create(*, customer_id: str, return_url: str) -> str:
    """Create a customer portal session; return its URL."""
    return client().v1.billing_portal.sessions.create(params={"customer": customer_id, "return_url": return_url}).url


def subscription_create(*, customer_id: str, price_id: str) -> dict[str, Any]:
    """Subscribe the customer to the metered ``price_id``; return ``{"id", "status"}``."""
    subscription = client().v1.subscriptions.create(
        params={"customer": customer_id, "items": [{"price": price_id}]},
        options={"idempotency_key": f"subscribe-{customer_id}-{price_id}"},
    )
    return {"id": subscription.id, "status": subscription.status}


def subscription_cancel(subscription_id: str) -> None:
    """Cancel the subscription now (Stripe invoices what was metered so far)."""
    client().v1.subscriptions.cancel(subscription_id)


def meter_event_send(*, customer_id: str, identifier: str, value: int, timestamp: int) -> None:
    """Send one Billing meter event of ``value`` (GPU-seconds, or CPU-seconds) to the meter
    ``STRIPE_METER_EVENT_NAME``. ``identifier`` (the ledger interval's id) is what Stripe
    dedupes on; ``timestamp`` is Unix seconds."""
    client().v1.billing.meter_events.create(
        params={
            "event_name": settings.STRIPE_METER_EVENT_NAME,
            "identifier": identifier,
            "timestamp": timestamp,
            "payload": {"stripe_customer_id": customer_id, "value": str(value)},
        }
    )


def webhook_event(payload: bytes, signature_header: str) -> dict[str, Any]:
    """Verify a webhook's ``Stripe-Signature`` over the raw ``payload`` with
    ``STRIPE_WEBHOOK_SECRET`` (``v1=`` HMAC-SHA256 of ``t.payload``, ``t=`` within
    ``WEBHOOK_TOLERANCE_S`` of now either way: Stripe's library refuses only an old one) and
    return the event as a dict.

    Raises ``stripe.SignatureVerificationError`` for a missing, forged, stale or future
    signature and ValueError for a body that is not JSON or nests deeper than
    ``lab.lib.jsonbounds.MAX_JSON_DEPTH``.
    """
    stripe.WebhookSignature.verify_header(
        payload.decode("utf-8"), signature_header, settings.STRIPE_WEBHOOK_SECRET, WEBHOOK_TOLERANCE_S
    )
    # The header verified, so its first t= is the signed timestamp (the library reads it the same way).
    signed_at = int(next(item.split("=", 2)[1] for item in signature_header.split(",") if item.split("=", 2)[0] == "t"))
    if signed_at > time.time() + WEBHOOK_TOLERANCE_S:
        raise stripe.SignatureVerificationError(
            f"Timestamp {signed_at} is more than {WEBHOOK_TOLERANCE_S} s in the future", signature_header, payload.decode("utf-8")
        )
    return json_loads(payload)
