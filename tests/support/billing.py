"""Billing records and Stripe webhook events the billing tests build."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.db import connection
from django.test import Client
from django.utils import timezone

from billing import stripe_api
from billing.accounts import account_for
from billing.ledger import AttemptUsage, usage_close
from billing.models import BillingAccount
from tests.billing.conftest import SECRET
from tests.support.fake_stripe import signed


def record(tenant, *, job_id="job_one", seconds=120, resource="cpu", gpus=0, attempt_id=1, ended=None):
    """Close ``seconds`` of usage of one attempt of ``tenant`` ending at ``ended`` (default now)."""
    ended = ended or timezone.now()
    usage = AttemptUsage(
        organization_id=tenant.organization.pk, project_id=tenant.project.pk, job_public_id=job_id,
        attempt_id=attempt_id, attempt_number=1, resource_type=resource, gpus=gpus,
        started_at=ended - timedelta(seconds=seconds), ended_at=ended,
    )
    return usage_close(usage=usage, now=ended)


def event(type_: str, obj: dict, *, event_id: str = "evt_1", created: int | None = None, api_version: str | None = None) -> dict:
    return {
        "id": event_id, "object": "event", "type": type_, "api_version": api_version or stripe_api.PINNED_API_VERSION,
        "created": created or int(time.time()), "data": {"object": obj},
    }


def post_webhook(payload: bytes, signature: str):
    return Client().post("/billing/stripe/webhook", payload, content_type="application/json", HTTP_STRIPE_SIGNATURE=signature)


def deliver(evt: dict, *, timestamp: int | None = None):
    return post_webhook(*signed(evt, SECRET, timestamp=timestamp))


def checkout_completed(tenant, *, session_id="cs_test_1", cents=2500, event_id="evt_checkout") -> dict:
    return event("checkout.session.completed", {
        "id": session_id, "object": "checkout.session", "mode": "payment", "payment_status": "paid",
        "client_reference_id": tenant.organization.public_id, "metadata": {"organization": tenant.organization.public_id, "credit_cents": str(cents)},
    }, event_id=event_id)


def invoiced(tenant) -> None:
    account = account_for(tenant.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(plan="invoiced", stripe_customer_id="cus_inv")


def at_once(work: Callable[[], None], threads: int) -> list[Exception]:
    """Run ``work`` in ``threads`` threads released together (each with its own database
    connection, closed after); return the exceptions they raised."""
    barrier = threading.Barrier(threads)
    errors: list[Exception] = []

    def run() -> None:
        try:
            barrier.wait()
            work()
        except Exception as exc:  # returned to the test
            errors.append(exc)
        finally:
            connection.close()

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return errors
