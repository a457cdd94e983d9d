"""The one rule of what is worth retrying over HTTP: network errors, 429 and 5xx."""

import pytest
from labsdk.retry import is_retryable_status


@pytest.mark.parametrize("status", [None, 429, 500, 502, 503, 504, 599])
def test_it_retries_network_errors_429_and_5xx(status):
    assert is_retryable_status(status) is True


@pytest.mark.parametrize("status", [200, 204, 301, 302, 307, 400, 401, 403, 404, 408, 409, 413, 422, 428, 499])
def test_it_does_not_retry_answers_a_resend_would_repeat(status):
    assert is_retryable_status(status) is False
