"""Stripe, stubbed only at its HTTP boundary (a fake Stripe API at STRIPE_API_BASE): Checkout and
the portal, switching plans, meter events sent once, and signed webhooks applied exactly once."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing.accounts import account_for
from billing.metering import meter_events_send
from billing.models import BillingAccount, CreditGrant, MeterEvent, StripeEvent
from lab.audit import Actor
from lab.services import api_key_create
from tests.billing.conftest import SECRET
from tests.support.billing import checkout_completed, deliver, event, invoiced, post_webhook, record
from tests.support.fake_stripe import signed

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "default_prices")]


# --- Checkout, portal, plans ---------------------------------------------------------------------


def test_checkout_carries_the_organization_and_answers_its_url(owner, fake_stripe):
    response = owner.client().post("/api/v1/billing/checkout", {"amount_usd": "25.00"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"url": "https://checkout.stripe.test/c/cs_test_2"}
    [customer] = fake_stripe.calls("/v1/customers")
    assert customer["form"]["metadata[organization]"] == owner.organization.public_id
    [session] = fake_stripe.calls("/v1/checkout/sessions")
    form = session["form"]
    assert (form["client_reference_id"], form["metadata[organization]"], form["metadata[credit_cents]"]) == (
        owner.organization.public_id, owner.organization.public_id, "2500"
    )
    assert form["line_items[0][price_data][unit_amount]"] == "2500"
    assert session["headers"]["Stripe-Version"] == "2026-10-28.endive"
    assert session["headers"]["Authorization"] == "Bearer sk_test_lab"
    assert account_for(owner.organization.pk).balance_micro_usd == 10_000_000  # credit comes with the webhook only


@pytest.mark.parametrize("body", [{"amount_usd": "4.99"}, {"amount_usd": 25}, {"amount_usd": "25.001"}, {"amount_usd": "1e9"}, {}, {"amount_usd": "25.00", "x": 1}])
def test_checkout_refuses_bad_amounts_without_calling_stripe(owner, fake_stripe, body):
    response = owner.client().post("/api/v1/billing/checkout", body, format="json")
    assert response.status_code == 400
    assert fake_stripe.requests == []


def test_a_member_key_without_write_cannot_buy_and_billing_off_is_409(owner, fake_stripe, settings):
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    assert owner.client(key).post("/api/v1/billing/checkout", {"amount_usd": "25.00"}, format="json").status_code == 403
    assert owner.client(key).post("/api/v1/billing/portal").status_code == 403
    settings.STRIPE_API_KEY = ""
    assert owner.client().post("/api/v1/billing/checkout", {"amount_usd": "25.00"}, format="json").status_code == 409
    assert fake_stripe.requests == []


def test_the_portal_answers_its_url(owner, fake_stripe):
    response = owner.client().post("/api/v1/billing/portal")
    assert response.status_code == 200
    assert response.json()["url"].startswith("https://billing.stripe.test/p/")
    assert fake_stripe.calls("/v1/billing_portal/sessions")[0]["form"]["customer"] == "cus_test1"


def test_switching_to_invoiced_subscribes_to_the_metered_price_and_back(owner, fake_stripe):
    response = owner.client().patch("/api/v1/billing/settings", {"plan": "invoiced"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["plan"] == "invoiced"
    [subscription] = fake_stripe.calls("/v1/subscriptions")
    assert subscription["form"] == {"customer": "cus_test1", "items[0][price]": "price_metered_gpu_seconds"}
    account = account_for(owner.organization.pk)
    assert (account.plan, account.stripe_subscription_id) == ("invoiced", "sub_2")

    assert owner.client().patch("/api/v1/billing/settings", {"plan": "prepaid"}, format="json").json()["plan"] == "prepaid"
    assert [call["method"] for call in fake_stripe.requests if call["path"].startswith("/v1/subscriptions/")] == ["DELETE"]


# --- meter events --------------------------------------------------------------------------------


def test_an_invoiced_organization_sends_each_interval_once_and_is_never_charged_credit(owner, fake_stripe, settings):
    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 1}]}
    invoiced(owner)
    record(owner, seconds=180, resource="H100", gpus=2)  # three intervals of 120 GPU-seconds

    assert meter_events_send() == 3
    assert meter_events_send() == 0  # nothing owed any more
    events = fake_stripe.accepted_meter_events
    assert [(e["event_name"], e["payload[stripe_customer_id]"], e["payload[value]"]) for e in events] == [("lab_gpu_seconds", "cus_inv", "120")] * 3
    assert len({e["identifier"] for e in events}) == 3
    assert {e["identifier"] for e in events} == set(MeterEvent.objects.values_list("interval__public_id", flat=True))
    assert account_for(owner.organization.pk).balance_micro_usd == 10_000_000


def test_an_interrupted_meter_run_rerun_sends_each_identifier_once(owner, fake_stripe):
    import stripe

    invoiced(owner)
    record(owner, seconds=300)  # five intervals
    original = fake_stripe.handle
    meter_calls = []

    def refuse_the_third(method, path, form, headers):
        if path == "/v1/billing/meter_events":
            meter_calls.append(form["identifier"])
            if len(meter_calls) == 3:
                fake_stripe.fail_next[path] = [400]  # a refusal the client does not retry: the run stops
        return original(method, path, form, headers)

    fake_stripe.handle = refuse_the_third
    with pytest.raises(stripe.StripeError):
        meter_events_send()
    assert len(fake_stripe.accepted_meter_events) == 2

    assert meter_events_send() == 3
    identifiers = [e["identifier"] for e in fake_stripe.accepted_meter_events]
    assert len(identifiers) == 5 and len(set(identifiers)) == 5
    assert meter_calls[2] == meter_calls[3]  # the refused one was tried again, under the same identifier
    assert MeterEvent.objects.filter(state="sent").count() == 5


def test_a_prepaid_organization_never_sends_meter_events(owner, fake_stripe):
    record(owner, seconds=300)
    assert meter_events_send() == 0
    assert fake_stripe.calls("/v1/billing/meter_events") == []


# --- webhooks ------------------------------------------------------------------------------------


def test_a_signed_checkout_completed_raises_the_balance_once(owner, fake_stripe):
    evt = checkout_completed(owner)
    first, again = deliver(evt), deliver(evt)
    assert (first.status_code, first.json()["outcome"]) == (200, "applied")
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    # the same session in another event (Stripe resends under a new id rarely, but may) adds nothing
    assert deliver(checkout_completed(owner, event_id="evt_other")).json()["outcome"] == "ignored"
    assert account_for(owner.organization.pk).balance_micro_usd == 35_000_000
    assert CreditGrant.objects.filter(account__organization=owner.organization, kind="purchase").count() == 1


@pytest.mark.parametrize("tamper", ["forged", "stale", "missing", "other_secret", "garbage"])
def test_a_bad_signature_is_400_and_changes_nothing(owner, fake_stripe, tamper):
    evt = checkout_completed(owner)
    if tamper == "forged":
        payload, header = signed(evt, SECRET)
        payload = payload.replace(b"2500", b"9900")
    elif tamper == "stale":
        payload, header = signed(evt, SECRET, timestamp=int(time.time()) - 600)
    elif tamper == "missing":
        payload, header = signed(evt, SECRET)[0], ""
    elif tamper == "other_secret":
        payload, header = signed(evt, "whsec_someone_else")
    else:
        payload, header = b"\xff\xfe not json", "t=1,v1=00"
    response = post_webhook(payload, header)
    assert response.status_code == 400
    assert account_for(owner.organization.pk).balance_micro_usd == 10_000_000
    assert StripeEvent.objects.count() == 0


def test_another_api_version_is_400_and_changes_nothing(owner, fake_stripe, caplog):
    evt = checkout_completed(owner)
    evt["api_version"] = "2020-08-27"
    response = deliver(evt)
    assert response.status_code == 400
    assert "api_version" in response.json()["error"]
    assert account_for(owner.organization.pk).balance_micro_usd == 10_000_000
    assert any("another API version" in record.message for record in caplog.records)


def test_other_event_types_are_200_and_ignored(owner, fake_stripe):
    response = deliver(event("charge.refunded", {"id": "ch_1"}))
    assert (response.status_code, response.json()["outcome"]) == (200, "ignored")
    assert StripeEvent.objects.count() == 0


def test_a_failed_payment_refuses_new_jobs_until_paid_even_out_of_order(owner, fake_stripe, spec, no_broker):
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(stripe_customer_id="cus_pay")
    now = int(time.time())
    invoice = {"id": "in_1", "object": "invoice", "customer": "cus_pay"}

    assert deliver(event("invoice.payment_failed", invoice, event_id="evt_f", created=now - 60)).status_code == 200
    refused = owner.client().post("/api/v1/jobs", spec, format="json")
    assert (refused.status_code, refused.json()["error"]["code"]) == (402, "payment_failed")

    assert deliver(event("invoice.paid", invoice, event_id="evt_p", created=now)).json()["outcome"] == "applied"
    assert account_for(owner.organization.pk).payment_failed is False
    # a retried failure from before the payment arrives late: older news, not applied
    assert deliver(event("invoice.payment_failed", invoice, event_id="evt_f2", created=now - 30)).json()["outcome"] == "ignored"
    assert account_for(owner.organization.pk).payment_failed is False
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201


def test_subscription_events_change_the_plan_and_a_late_created_after_deleted_changes_nothing(owner, fake_stripe):
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(stripe_customer_id="cus_sub")
    now = int(time.time())
    subscription = {"id": "sub_9", "object": "subscription", "customer": "cus_sub", "status": "active"}

    assert deliver(event("customer.subscription.deleted", {**subscription, "status": "canceled"}, event_id="evt_d", created=now)).json()["outcome"] == "applied"
    assert deliver(event("customer.subscription.created", subscription, event_id="evt_c", created=now - 5)).json()["outcome"] == "ignored"
    account = account_for(owner.organization.pk)
    assert (account.plan, account.subscription_status) == ("prepaid", "canceled")

    assert deliver(event("customer.subscription.updated", subscription, event_id="evt_u", created=now + 5)).json()["outcome"] == "applied"
    assert account_for(owner.organization.pk).plan == "invoiced"


def test_the_webhook_refuses_get_and_oversized_bodies(owner, fake_stripe):
    assert Client().get("/billing/stripe/webhook").status_code == 405
    payload, header = signed({"id": "evt_big", "pad": "x" * (2 * 1024 * 1024)}, SECRET)
    assert post_webhook(payload, header).status_code in (400, 413)
    assert StripeEvent.objects.count() == 0


def test_month_boundaries_count_only_this_month(owner, fake_stripe):
    record(owner, seconds=3600, ended=timezone.now() - timedelta(days=40), attempt_id=7)
    assert owner.client().get("/api/v1/billing/balance").json()["spent_this_month_usd"] == "0.00"


def test_the_meter_task_retries_a_stripe_error_and_then_sends_everything_once(owner, fake_stripe):
    from billing.tasks import send_meter_events

    invoiced(owner)
    record(owner, seconds=120)
    fake_stripe.fail_next["/v1/billing/meter_events"] = [400]

    result = send_meter_events.apply()  # eager: a retry runs again at once

    assert result.successful(), result.traceback
    assert result.result == 2
    assert len(fake_stripe.calls("/v1/billing/meter_events")) == 3  # the refused one, then both
    assert sorted(e["identifier"] for e in fake_stripe.accepted_meter_events) == sorted(
        MeterEvent.objects.values_list("interval__public_id", flat=True)
    )
    assert send_meter_events.retry_backoff == 5 and send_meter_events.retry_backoff_max == 600


@pytest.mark.parametrize("change", [{"created": 10**20}, {"created": "yesterday"}, {"data": []}, {"data": {"object": None}}])
def test_a_signed_but_malformed_event_is_400_and_changes_nothing(owner, fake_stripe, change):
    response = deliver(checkout_completed(owner) | change)
    assert response.status_code == 400
    assert account_for(owner.organization.pk).balance_micro_usd == 10_000_000
    assert StripeEvent.objects.count() == 0
