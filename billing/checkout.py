"""Buying credit and managing payment: Stripe Checkout sessions and the customer portal.

``POST /billing/checkout {"amount_usd": "25.00"}`` → the URL of a Checkout session whose
``client_reference_id`` and ``metadata.organization`` are the organization's public id; the
credit is added when Stripe's ``checkout.session.completed`` arrives (``billing.webhooks``),
never on the redirect. ``POST /billing/portal`` → the customer portal's URL.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.db import transaction

from billing import stripe_api
from billing.accounts import billing_enabled, locked_account
from billing.services import require_billing_manager
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import FieldError, LabError
from lab.models import Organization

MIN_PURCHASE_USD = Decimal("5.00")
MAX_PURCHASE_USD = Decimal("10000.00")


def _amount_cents(data: Any) -> int:
    """Return ``amount_usd`` of a checkout body in cents; 400 unless a decimal string in range."""
    message = f'amount_usd must be a decimal string of USD from "{MIN_PURCHASE_USD}" to "{MAX_PURCHASE_USD}", in cents.'
    error = LabError("invalid_request", message, errors=[FieldError("amount_usd", "invalid", message)])
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    unknown = sorted(str(key) for key in data if key != "amount_usd")
    if unknown:
        text = f"Unknown field {unknown[0]!r}; the body has amount_usd only."
        raise LabError("invalid_request", text, errors=[FieldError(key, "unknown", text) for key in unknown])
    value = data.get("amount_usd")
    if not isinstance(value, str) or len(value) > 20:
        raise error
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise error from None
    if not amount.is_finite() or not MIN_PURCHASE_USD <= amount <= MAX_PURCHASE_USD or amount.as_tuple().exponent < -2:
        raise error
    return int(amount * 100)


def _require_billing() -> None:
    if not billing_enabled():
        raise LabError("invalid_state", "Billing is off on this Lab (no STRIPE_API_KEY); there is nothing to pay.")


def checkout_create(*, actor: Actor, organization: Organization, data: Any) -> str:
    """Create a Checkout session buying ``data["amount_usd"]`` of credit; return its URL.

    Raises LabError (``require_billing_manager``), 400 for a bad amount, 409
    ``invalid_state`` when billing is off or the organization is invoiced.
    """
    require_billing_manager(actor=actor, organization=organization)
    cents = _amount_cents(data)
    _require_billing()
    with transaction.atomic():
        account = locked_account(organization.pk)
        if account.plan != "prepaid":
            raise LabError("invalid_state", "An invoiced organization pays by invoice; credits are for prepaid plans.")
        customer = stripe_api.ensure_customer(account)
        audit_record(actor=actor, organization=organization, action=AuditAction.BILLING_CHECKOUT_CREATE,
                     target=organization.public_id, data={"amount_usd": data["amount_usd"]})
    base = settings.LAB_PUBLIC_URL.rstrip("/")
    return stripe_api.checkout_session_create(
        customer_id=customer,
        organization_public_id=organization.public_id,
        amount_cents=cents,
        success_url=f"{base}/billing?checkout=success",
        cancel_url=f"{base}/billing?checkout=cancelled",
    )


def portal_create(*, actor: Actor, organization: Organization) -> str:
    """Return the URL of a Stripe customer portal session for the organization.

    Raises LabError (``require_billing_manager``), 409 ``invalid_state`` when billing is off.
    """
    require_billing_manager(actor=actor, organization=organization)
    _require_billing()
    with transaction.atomic():
        customer = stripe_api.ensure_customer(locked_account(organization.pk))
    return stripe_api.portal_session_create(customer_id=customer, return_url=f"{settings.LAB_PUBLIC_URL.rstrip('/')}/billing")
