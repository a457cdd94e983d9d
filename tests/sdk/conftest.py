"""Fixtures for SDK and CLI tests: a fake Lab on a real local socket and clients pointed at it.

Nothing here touches Django or the database: labsdk must work on its own.
"""

from __future__ import annotations

import pytest
from labsdk import Lab

from tests.sdk.fake_lab import API_KEY, FakeLab, FakeLabServer


@pytest.fixture
def fake_lab() -> FakeLab:
    with FakeLabServer() as state:
        yield state


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Record the SDK's pauses (retry backoff, wait polling) instead of sleeping them."""
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    return slept


@pytest.fixture
def lab_client(fake_lab: FakeLab, sleeps: list[float]) -> Lab:
    with Lab(api_key=API_KEY, base_url=fake_lab.url, timeout=5, max_retries=2) as client:
        yield client


@pytest.fixture
def lab_env(fake_lab: FakeLab, sleeps: list[float], monkeypatch) -> FakeLab:
    """Point LAB_API_KEY / LAB_BASE_URL (what the CLI and the default client read) at the fake."""
    monkeypatch.setenv("LAB_API_KEY", API_KEY)
    monkeypatch.setenv("LAB_BASE_URL", fake_lab.url)
    monkeypatch.setattr("labsdk._default._client", None)
    return fake_lab
