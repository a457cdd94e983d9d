"""Signed Stripe events whose fields Lab cannot store or did not write (billing/webhooks.py):
an event id or type that is no Stripe id, a boolean ``created``, a Checkout session without an
id, with an over-long one, or with ``credit_cents`` that Lab's Checkout never writes (a list, a
float, more than it sells), a subscription with an over-long id or status. Each was a 500 (or,
for a float, credit of the rounded amount); now each is a 400 or an ignored event that changes
nothing."""

from __future__ import annotations

import pytest

from billing.accounts import account_for
from billing.models import BillingAccount, CreditGrant, StripeEvent
from tests.support.billing import checkout_completed, deliver, event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "default_prices")]

TRIAL_MICRO_USD = 10_000_000


def session_with(tenant, **changes) -> dict:
    evt = checkout_completed(tenant)
    evt["data"]["object"].update(changes)
    return evt


def credit(tenant, cents) -> dict:
    return session_with(tenant, metadata={"organization": tenant.organization.public_id, "credit_cents": cents})


@pytest.mark.parametrize("build", [
    lambda tenant: checkout_completed(tenant, event_id="evt_" + "x" * 300),
    lambda tenant: checkout_completed(tenant, event_id="evt_\x00"),
    lambda tenant: checkout_completed(tenant, event_id=""),
    lambda tenant: checkout_completed(tenant) | {"type": "checkout.session.completed" + "x" * 100},
    lambda tenant: checkout_completed(tenant) | {"created": True},
], ids=["event-id-over-255", "event-id-nul", "event-id-empty", "type-over-100", "created-boolean"])
def test_an_event_lab_cannot_record_is_a_400_that_changes_nothing(owner, fake_stripe, build):
    response = deliver(build(owner))

    assert response.status_code == 400, response.content
    assert StripeEvent.objects.count() == 0
    assert account_for(owner.organization.pk).balance_micro_usd == TRIAL_MICRO_USD


@pytest.mark.parametrize("build", [
    lambda tenant: {**checkout_completed(tenant), "data": {"object": {
        key: value for key, value in checkout_completed(tenant)["data"]["object"].items() if key != "id"}}},
    lambda tenant: session_with(tenant, id="cs_" + "x" * 300),
    lambda tenant: session_with(tenant, metadata=["credit_cents", "2500"]),
    lambda tenant: credit(tenant, [2500]),
    lambda tenant: credit(tenant, 25.7),
    lambda tenant: credit(tenant, "2500.5"),
    lambda tenant: credit(tenant, " 2500"),
    lambda tenant: credit(tenant, str(10**17)),
    lambda tenant: credit(tenant, "1000001"),
], ids=["session-without-id", "session-id-over-200", "metadata-list", "cents-list", "cents-float", "cents-decimal",
        "cents-space", "cents-overflow", "cents-over-the-most-checkout-sells"])
def test_a_checkout_session_lab_did_not_write_is_ignored_and_credits_nothing(owner, fake_stripe, build):
    response = deliver(build(owner))

    assert (response.status_code, response.json()["outcome"]) == (200, "ignored"), response.content
    assert account_for(owner.organization.pk).balance_micro_usd == TRIAL_MICRO_USD
    assert not CreditGrant.objects.filter(account__organization=owner.organization, kind="purchase").exists()
    assert list(StripeEvent.objects.values_list("outcome", flat=True)) == ["ignored"]


def test_the_most_checkout_sells_is_still_credited(owner, fake_stripe):
    response = deliver(credit(owner, "1000000"))

    assert (response.status_code, response.json()["outcome"]) == (200, "applied")
    assert account_for(owner.organization.pk).balance_micro_usd == TRIAL_MICRO_USD + 10_000_000_000


@pytest.mark.parametrize("subscription", [
    {"id": "sub_" + "x" * 100, "customer": "cus_hostile", "status": "active"},
    {"id": "sub_1", "customer": "cus_hostile", "status": "active" * 10},
    {"id": ["sub_1"], "customer": "cus_hostile", "status": "active"},
    {"id": "sub_1", "customer": "cus_hostile", "status": 1},
], ids=["id-over-64", "status-over-32", "id-list", "status-number"])
def test_a_subscription_lab_cannot_store_is_ignored_and_changes_nothing(owner, fake_stripe, subscription):
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(stripe_customer_id="cus_hostile")

    response = deliver(event("customer.subscription.updated", subscription))

    assert (response.status_code, response.json()["outcome"]) == (200, "ignored"), response.content
    after = BillingAccount.objects.get(pk=account.pk)
    assert (after.plan, after.stripe_subscription_id, after.subscription_status, after.subscription_updated_at) == (
        account.plan, "", "", None,
    )
