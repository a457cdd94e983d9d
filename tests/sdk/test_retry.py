"""The rules of retrying over HTTP: what is worth retrying (network errors, 429 and 5xx), and how long to wait."""

import pytest
from labsdk.retry import exponential_backoff, is_retryable_status


@pytest.mark.parametrize("status", [None, 429, 500, 502, 503, 504, 599])
def test_it_retries_network_errors_429_and_5xx(status):
    assert is_retryable_status(status) is True


@pytest.mark.parametrize("status", [200, 204, 301, 302, 307, 400, 401, 403, 404, 408, 409, 413, 422, 428, 499])
def test_it_does_not_retry_answers_a_resend_would_repeat(status):
    assert is_retryable_status(status) is False


def test_the_backoff_doubles_from_its_base_up_to_its_cap():
    waits = [exponential_backoff(retry, base=0.5, cap=5.0) for retry in range(6)]

    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_the_backoff_stays_at_its_cap_however_many_retries():
    assert exponential_backoff(10_000, base=0.5, cap=30.0) == 30.0


def test_jitter_scales_the_backoff_by_a_factor_between_a_half_and_one(monkeypatch):
    monkeypatch.setattr("random.uniform", lambda low, high: low)
    assert exponential_backoff(3, base=0.5, cap=8.0, jitter=True) == 2.0
    monkeypatch.setattr("random.uniform", lambda low, high: high)
    assert exponential_backoff(3, base=0.5, cap=8.0, jitter=True) == 4.0
    assert exponential_backoff(9, base=0.5, cap=8.0, jitter=True) == 8.0
