"""Webhook tries are retried by the one rule Lab's clients share (labsdk.retry.is_retryable_status):
no answer, 429 and 5xx again on the schedule; 2xx delivered; every other status fails at once."""

from __future__ import annotations

import pytest

import jobs.webhooks.delivery as webhook_delivery
from jobs.webhooks.endpoints import endpoint_create, endpoint_send_test
from jobs.webhooks.models import DeliveryStatus, WebhookDelivery
from lab.audit import Actor
from lab.lib.http import RequestFailed, Response

pytestmark = pytest.mark.django_db


class AnsweringClient:
    """Stands in for the hardened client: every POST gets ``status`` (or raises ``failure``)."""

    def __init__(self, status: int = 200, failure: Exception | None = None) -> None:
        self.status, self.failure = status, failure

    def post(self, url, *, content, headers):
        if self.failure is not None:
            raise self.failure
        return Response(status_code=self.status, headers={}, excerpt="", duration_ms=3)


def try_once(owner, clock, monkeypatch, client: AnsweringClient):
    monkeypatch.setattr(webhook_delivery, "_client", lambda: client)
    endpoint = endpoint_create(project=owner.project, actor=Actor(user=owner.user), data={"url": "http://127.0.0.1:9/"})
    delivery = endpoint_send_test(endpoint=endpoint, actor=Actor(user=owner.user), now=clock.now)
    [result] = webhook_delivery.deliver([delivery.pk], now=clock.now)
    return result, WebhookDelivery.objects.get(pk=delivery.pk)


@pytest.mark.parametrize(
    ("status", "retried"),
    [(429, True), (500, True), (503, True), (408, False), (400, False), (404, False), (410, False), (301, False)],
)
def test_a_failed_answer_is_retried_only_when_the_shared_rule_says_so(owner, clock, monkeypatch, status, retried):
    result, delivery = try_once(owner, clock, monkeypatch, AnsweringClient(status))
    assert (result.succeeded, result.retryable, result.status_code) == (False, retried, status)
    assert result.error == f"HTTP {status}"
    if retried:
        assert (delivery.status, delivery.next_attempt_at > clock.now) == (DeliveryStatus.PENDING, True)
    else:
        assert (delivery.status, delivery.next_attempt_at) == (DeliveryStatus.FAILED, None)


def test_no_answer_is_retried(owner, clock, monkeypatch):
    result, delivery = try_once(owner, clock, monkeypatch, AnsweringClient(failure=RequestFailed("connection refused")))
    assert (result.retryable, result.status_code, result.error) == (True, None, "connection refused")
    assert delivery.status == DeliveryStatus.PENDING


def test_a_2xx_is_delivered(owner, clock, monkeypatch):
    result, delivery = try_once(owner, clock, monkeypatch, AnsweringClient(204))
    assert (result.succeeded, result.retryable) == (True, False)
    assert (delivery.status, delivery.last_status_code) == (DeliveryStatus.SUCCEEDED, 204)
