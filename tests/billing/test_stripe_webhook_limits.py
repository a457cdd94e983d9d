"""Validly signed Stripe webhooks Lab must still refuse or order: a body nested hundreds of
levels deep (was a RecursionError, a 500), a ``Stripe-Signature`` timestamp ten minutes in the
future (was accepted; Stripe's tolerance is 5 minutes either way), and an
``invoice.payment_failed`` of the same second as the ``invoice.paid`` already applied (was
applied, blocking a paid organization)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest

from billing import stripe_api
from billing.accounts import account_for
from billing.models import BillingAccount, StripeEvent
from tests.billing.conftest import SECRET
from tests.support.billing import checkout_completed, deliver, event, post_webhook

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "default_prices")]

TRIAL_MICRO_USD = 10_000_000


def sign_text(payload: bytes, *, timestamp: int | None = None) -> str:
    """Return the ``Stripe-Signature`` of ``payload`` with the endpoint's secret."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


@pytest.mark.parametrize("depth", [100, 500, 990])
def test_a_signed_event_nested_hundreds_of_levels_deep_is_a_400_that_changes_nothing(owner, fake_stripe, depth):
    evt = checkout_completed(owner)
    evt["data"]["object"]["metadata"]["note"] = "DEEP"
    payload = json.dumps(evt).replace('"DEEP"', "[" * depth + "]" * depth).encode()

    response = post_webhook(payload, sign_text(payload))

    assert response.status_code == 400, response.content
    assert response.json() == {"error": "Invalid Stripe signature or body: JSON nested deeper than 64 levels of objects and arrays"}
    assert StripeEvent.objects.count() == 0
    assert account_for(owner.organization.pk).balance_micro_usd == TRIAL_MICRO_USD


@pytest.mark.parametrize("ahead_s", [301, 600])
def test_a_signature_timestamp_in_the_future_is_a_400_that_changes_nothing(owner, fake_stripe, ahead_s):
    response = deliver(checkout_completed(owner), timestamp=int(time.time()) + ahead_s)

    assert response.status_code == 400, response.content
    assert "in the future" in response.json()["error"]
    assert StripeEvent.objects.count() == 0
    assert account_for(owner.organization.pk).balance_micro_usd == TRIAL_MICRO_USD


def test_a_signature_timestamp_a_little_ahead_is_accepted(owner, fake_stripe):
    response = deliver(checkout_completed(owner), timestamp=int(time.time()) + stripe_api.WEBHOOK_TOLERANCE_S - 10)

    assert (response.status_code, response.json()["outcome"]) == (200, "applied")


def customer(tenant) -> None:
    BillingAccount.objects.filter(pk=account_for(tenant.organization.pk).pk).update(stripe_customer_id="cus_tie")


def test_a_payment_failure_of_the_same_second_as_the_payment_is_not_applied_after_it(owner, fake_stripe, spec, no_broker):
    customer(owner)
    now = int(time.time())
    invoice = {"id": "in_1", "object": "invoice", "customer": "cus_tie"}

    paid = deliver(event("invoice.paid", {**invoice, "status": "paid"}, event_id="evt_paid", created=now))
    failed = deliver(event("invoice.payment_failed", {**invoice, "status": "open"}, event_id="evt_failed", created=now))

    assert paid.json()["outcome"] == "applied"
    assert failed.json()["outcome"] == "ignored"
    account = account_for(owner.organization.pk)
    assert account.payment_failed is False
    assert account.payment_status_updated_at.timestamp() == now
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201


def test_a_payment_of_the_same_second_as_a_failure_clears_it(owner, fake_stripe):
    customer(owner)
    now = int(time.time())
    invoice = {"id": "in_1", "object": "invoice", "customer": "cus_tie"}

    failed = deliver(event("invoice.payment_failed", {**invoice, "status": "open"}, event_id="evt_failed", created=now))
    paid = deliver(event("invoice.paid", {**invoice, "status": "paid"}, event_id="evt_paid", created=now))

    assert (failed.json()["outcome"], paid.json()["outcome"]) == ("applied", "applied")
    assert account_for(owner.organization.pk).payment_failed is False
