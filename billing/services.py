"""Billing actions taken by people: who may manage billing, and changing the billing settings.

Owners and admins of an organization manage its billing (spend limit, concurrency cap, plan,
buying credits, the customer portal): in the dashboard, or through a write-scoped API key of one
of its projects, which acts for the owner or admin who created it and only while they still are
one. A plain member, a read-only key, or a key whose creator is not (or no longer) an owner or
admin may read usage and the balance, and is refused with 403 ``insufficient_scope``; a user or
key of another organization gets 404.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.db import transaction

from billing import stripe_api
from billing.accounts import billing_enabled, locked_account
from billing.models import BillingAccount, Plan
from billing.pricing import usd_to_micro
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import FieldError, LabError, not_found
from lab.models import MANAGER_ROLES, ApiKeyScope, Membership, Organization

#: The largest monthly spend limit accepted (USD): bounds the ledger's integers far away.
MAX_SPEND_LIMIT_USD = Decimal("10000000")
SETTINGS_KEYS = ("monthly_spend_limit_usd", "max_running_jobs")


def require_billing_manager(*, actor: Actor, organization: Organization) -> None:
    """Refuse an actor who may not change ``organization``'s billing (see the module docstring).

    Raises LabError ``insufficient_scope`` or 404 ``not_found``.
    """
    if actor.api_key is not None:
        if actor.api_key.project.organization_id != organization.pk:
            raise not_found("organization")
        if ApiKeyScope.WRITE not in actor.api_key.scopes:
            raise LabError("insufficient_scope", f"This API key lacks the '{ApiKeyScope.WRITE}' scope.")
        # Billing is the organization's, not the key's project's: the key acts for its creator.
        creator = actor.api_key.created_by_id
        if creator is None or not Membership.objects.filter(
            user_id=creator, organization=organization, role__in=MANAGER_ROLES
        ).exists():
            raise LabError(
                "insufficient_scope",
                "Only organization owners and admins change billing; this API key's creator is not one.",
            )
    if actor.user is not None:
        membership = Membership.objects.filter(user=actor.user, organization=organization).first()
        if membership is None:
            raise not_found("organization")
        if not membership.can_manage:
            raise LabError("insufficient_scope", "Only organization owners and admins may change billing.")


def _spend_limit(value: Any) -> int | None:
    """Return a spend limit body value (a decimal string in USD, or null) in micro-dollars."""
    if value is None:
        return None
    message = f'monthly_spend_limit_usd must be a decimal string of USD from "0.00" to "{MAX_SPEND_LIMIT_USD}", or null.'
    if not isinstance(value, str) or len(value) > 20:
        raise LabError("invalid_request", message, errors=[FieldError("monthly_spend_limit_usd", "invalid", message)])
    try:
        amount = Decimal(value)
    except InvalidOperation:
        amount = None
    if amount is None or not amount.is_finite() or not 0 <= amount <= MAX_SPEND_LIMIT_USD or amount.as_tuple().exponent < -2:
        raise LabError("invalid_request", message, errors=[FieldError("monthly_spend_limit_usd", "invalid", message)])
    return usd_to_micro(amount)


def _max_running_jobs(value: Any) -> int | None:
    """Return a concurrency cap body value (1 to ``LAB_ORG_MAX_RUNNING_JOBS``, or null)."""
    ceiling = settings.LAB_ORG_MAX_RUNNING_JOBS
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
        message = f"max_running_jobs must be an integer from 1 to {ceiling}, or null."
        raise LabError("invalid_request", message, errors=[FieldError("max_running_jobs", "out_of_range", message)])
    return value


def parse_settings(data: Any) -> dict[str, Any]:
    """Validate a ``PATCH /billing/settings`` body; return the changes (micro-dollars for money).

    Raises LabError ``invalid_request`` for a body that is not an object, unknown keys, or
    bad values; nothing is changed then.
    """
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    unknown = sorted(str(key) for key in data if key not in SETTINGS_KEYS and key != "plan")
    if unknown:
        message = f"Unknown setting {unknown[0]!r}; the settings are {', '.join(SETTINGS_KEYS + ('plan',))}."
        raise LabError("invalid_request", message, errors=[FieldError(key, "unknown", message) for key in unknown])
    changes: dict[str, Any] = {}
    if "monthly_spend_limit_usd" in data:
        changes["monthly_spend_limit_micro_usd"] = _spend_limit(data["monthly_spend_limit_usd"])
    if "max_running_jobs" in data:
        changes["max_running_jobs"] = _max_running_jobs(data["max_running_jobs"])
    if "plan" in data:
        changes["plan"] = data["plan"]
    return changes


@transaction.atomic
def billing_settings_update(*, actor: Actor, organization: Organization, data: Any) -> BillingAccount:
    """Change the organization's monthly spend limit and concurrency cap (and plan: see
    ``billing.plans.plan_change``) from a ``PATCH /billing/settings`` body.

    Raises LabError for an actor who may not (``require_billing_manager``), 400 for a
    bad body; nothing is changed then. Writes an audit row.
    """
    require_billing_manager(actor=actor, organization=organization)
    changes = parse_settings(data)
    account = locked_account(organization.pk)
    if "plan" in changes:
        plan_change(account=account, plan=changes.pop("plan"))
    if "monthly_spend_limit_micro_usd" in changes:
        account.monthly_spend_limit_micro_usd = changes["monthly_spend_limit_micro_usd"]
        account.save(update_fields=["monthly_spend_limit_micro_usd"])
    if "max_running_jobs" in changes:
        Organization.objects.filter(pk=organization.pk).update(max_running_jobs=changes["max_running_jobs"])
        organization.max_running_jobs = changes["max_running_jobs"]
    audit_record(
        actor=actor,
        organization=organization,
        action=AuditAction.BILLING_SETTINGS_UPDATE,
        target=organization.public_id,
        data=dict(data),
    )
    return account


def plan_change(*, account: BillingAccount, plan: Any) -> None:
    """Switch a locked account to ``plan`` (``prepaid`` or ``invoiced``); the same plan is a no-op.

    Needs billing on. Invoiced: the organization is subscribed to ``STRIPE_METERED_PRICE_ID``
    (``billing.stripe_api``); prepaid again: that subscription is cancelled. Raises LabError ``invalid_request``
    for another value, 409 ``invalid_state`` when billing is off or no metered price is set.
    """
    if plan not in Plan.values:
        message = f"plan must be one of {', '.join(Plan.values)}."
        raise LabError("invalid_request", message, errors=[FieldError("plan", "invalid", message)])
    if plan == account.plan:
        return
    if not billing_enabled():
        raise LabError("invalid_state", "Billing is off on this Lab (no STRIPE_API_KEY); the plan cannot change.")
    if plan == Plan.INVOICED:
        if not settings.STRIPE_METERED_PRICE_ID:
            raise LabError("invalid_state", "This Lab has no metered price (STRIPE_METERED_PRICE_ID); invoicing is off.")
        customer = stripe_api.ensure_customer(account)
        subscription = stripe_api.subscription_create(customer_id=customer, price_id=settings.STRIPE_METERED_PRICE_ID)
        account.stripe_subscription_id = subscription["id"]
        account.subscription_status = subscription.get("status", "")
    elif account.stripe_subscription_id:
        stripe_api.subscription_cancel(account.stripe_subscription_id)
        account.subscription_status = "canceled"
    account.plan = plan
    account.save(update_fields=["plan", "stripe_subscription_id", "subscription_status"])
