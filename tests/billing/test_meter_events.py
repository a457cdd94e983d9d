"""Meter events across crashes and concurrent runs (billing.metering): a run that dies after
Stripe accepted an event resends it under the same identifier only once its claim has lapsed and
only inside the resend window; past it the marker is unconfirmed, never resent, until an operator
resolves it; two runs at once send each interval once."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from billing import metering
from billing.metering import (
    CLAIM_LEASE,
    RESEND_WINDOW,
    meter_event_resolve,
    meter_events_send,
    unconfirmed_meter_events,
)
from billing.models import MeterEvent, MeterEventState
from tests.support.billing import at_once, invoiced, record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "default_prices")]


class Died(BaseException):
    """The worker process dying (killed, out of memory): no ``except Exception`` runs."""


def die_after_stripe_accepts(monkeypatch, *, call: int) -> None:
    """Make the ``call``-th meter event request reach Stripe and then the worker die."""
    real, calls = metering.stripe_api.meter_event_send, []

    def send(**kwargs):
        calls.append(kwargs["identifier"])
        real(**kwargs)
        if len(calls) == call:
            raise Died

    monkeypatch.setattr(metering.stripe_api, "meter_event_send", send)


def later(monkeypatch, delta: timedelta) -> None:
    moment = timezone.now() + delta
    monkeypatch.setattr(timezone, "now", lambda: moment)


def requests_per_identifier(fake) -> Counter:
    return Counter(request["form"]["identifier"] for request in fake.calls("/v1/billing/meter_events"))


def states() -> list[tuple[str, str, int]]:
    return list(MeterEvent.objects.order_by("interval_id").values_list("interval__public_id", "state", "attempts"))


def test_a_run_that_dies_after_stripe_accepted_resends_the_same_identifier_once_its_claim_lapses(owner, fake_stripe, monkeypatch):
    invoiced(owner)
    record(owner, seconds=180)  # three intervals
    die_after_stripe_accepts(monkeypatch, call=2)

    with pytest.raises(Died):
        meter_events_send()
    assert [(state, attempts) for _, state, attempts in states()] == [("sent", 1), ("sending", 1)]  # no third yet

    assert meter_events_send() == 1  # the third; the second is still claimed by the run that died
    later(monkeypatch, CLAIM_LEASE + timedelta(seconds=1))
    assert meter_events_send() == 1  # the second again, under its identifier
    assert meter_events_send() == 0

    assert [state for _, state, _ in states()] == ["sent"] * 3
    identifiers = [identifier for identifier, _, _ in states()]
    assert requests_per_identifier(fake_stripe) == {identifiers[0]: 1, identifiers[1]: 2, identifiers[2]: 1}
    assert [attempts for _, _, attempts in states()] == [1, 2, 1]


def test_past_the_resend_window_a_marker_is_unconfirmed_never_resent_until_an_operator_resolves_it(
    owner, fake_stripe, monkeypatch, caplog
):
    invoiced(owner)
    record(owner, seconds=120)  # two intervals
    for _ in range(2):  # the first run dies after sending the first; the next after the second
        with monkeypatch.context() as patch:
            die_after_stripe_accepts(patch, call=1)
            with pytest.raises(Died):
                meter_events_send()
    [one, two] = [identifier for identifier, _, _ in states()]

    later(monkeypatch, RESEND_WINDOW + timedelta(minutes=1))
    with caplog.at_level(logging.ERROR, logger="billing.metering"):
        assert meter_events_send() == 0
        assert meter_events_send() == 0

    assert [state for _, state, _ in states()] == ["unconfirmed"] * 2
    assert requests_per_identifier(fake_stripe) == {one: 1, two: 1}  # neither sent again
    assert [entry.interval for entry in caplog.records if entry.name == "billing.metering"] == [one, two]
    assert [marker.interval.public_id for marker in unconfirmed_meter_events()] == [one, two]

    assert meter_event_resolve(interval_public_id=one, stripe_has_it=True).state == MeterEventState.SENT
    assert meter_event_resolve(interval_public_id=two, stripe_has_it=False).state == MeterEventState.SENDING
    assert meter_events_send() == 1
    assert requests_per_identifier(fake_stripe) == {one: 1, two: 2}
    assert [state for _, state, _ in states()] == ["sent"] * 2
    with pytest.raises(MeterEvent.DoesNotExist):
        meter_event_resolve(interval_public_id=one, stripe_has_it=False)  # only unconfirmed ones


def test_a_refused_event_is_free_to_be_sent_again_at_once(owner, fake_stripe):
    import stripe

    invoiced(owner)
    record(owner, seconds=60)
    fake_stripe.fail_next["/v1/billing/meter_events"] = [400]
    with pytest.raises(stripe.StripeError):
        meter_events_send()
    assert meter_events_send() == 1  # no lapse to wait for: the run that failed let it go
    assert list(requests_per_identifier(fake_stripe).values()) == [2]


@pytest.mark.django_db(transaction=True)  # threads, each on its own connection
def test_two_runs_at_once_send_each_interval_once(owner, fake_stripe):
    invoiced(owner)
    record(owner, seconds=600)  # ten intervals
    sent = []

    errors = at_once(lambda: sent.append(meter_events_send()), threads=4)

    assert errors == []
    assert sum(sent) == 10
    assert list(requests_per_identifier(fake_stripe).values()) == [1] * 10
    assert [state for _, state, _ in states()] == ["sent"] * 10


def test_an_operator_resolves_unconfirmed_meter_events_in_the_admin(owner, fake_stripe, monkeypatch):
    invoiced(owner)
    record(owner, seconds=60)
    with monkeypatch.context() as patch:
        die_after_stripe_accepts(patch, call=1)
        with pytest.raises(Died):
            meter_events_send()
    with monkeypatch.context() as patch:
        later(patch, RESEND_WINDOW + timedelta(minutes=1))
        meter_events_send()
    marker = MeterEvent.objects.get()
    assert marker.state == MeterEventState.UNCONFIRMED
    admin = get_user_model().objects.create_superuser("ops@lab.test", "a long operator password")
    client = Client()
    client.force_login(admin)

    listing = client.get("/admin/billing/meterevent/?state__exact=unconfirmed")
    response = client.post(
        "/admin/billing/meterevent/", {"action": "stripe_has_it", "_selected_action": [marker.pk]}, follow=True
    )

    assert listing.status_code == 200 and marker.interval.public_id in listing.content.decode()
    assert response.status_code == 200
    marker.refresh_from_db()
    assert marker.state == MeterEventState.SENT
    assert list(requests_per_identifier(fake_stripe).values()) == [1]
