"""Fixtures for webhook tests: private addresses allowed (the receiver is on 127.0.0.1), a
short retry schedule, and a helper that runs due deliveries in this process with a given clock."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from jobs.webhooks.delivery import DeliveryResult, deliver
from labsdk.webhooks import WebhookReceiver
from tests.conftest import TINY_SPEC


@pytest.fixture(autouse=True)
def _webhook_settings(settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    settings.LAB_WEBHOOK_RETRY_SCHEDULE = [0, 5, 300, 1800]
    settings.LAB_WEBHOOK_TIMEOUT_S = 15
    yield settings


@pytest.fixture
def spec() -> dict:
    """A fresh copy of a small valid spec."""
    return copy.deepcopy(TINY_SPEC)


@pytest.fixture
def receiver():
    with WebhookReceiver() as running:
        yield running


class Clock:
    """An injectable clock: ``now`` moves only when the test says so."""

    def __init__(self) -> None:
        self.now: datetime = timezone.now()

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def drain(now: datetime | None = None, *, rounds: int = 10_000) -> list[DeliveryResult]:
    """Run every delivery due at ``now`` (and retries due by then) until none is due; return the results."""
    results: list[DeliveryResult] = []
    for _ in range(rounds):
        batch = deliver(None, now=now or timezone.now(), limit=100)
        if not batch:
            return results
        results.extend(batch)
    raise AssertionError("deliveries never ran out")
