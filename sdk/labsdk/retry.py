"""What is worth sending again over HTTP: the one rule the SDK, the engine and Lab share.

STYLE.md §6: retry only network errors, 429 and 5xx. A request that got no answer (refused or
reset connection, timeout) may never have arrived, or its answer was lost; 429 Too Many
Requests (RFC 6585 §4) and the 5xx server errors (RFC 9110 §15.6) say the server cannot answer
now. Any other answer is the server's word on this request and a resend gets the same one:
the other 4xx refusals, and 3xx, since Lab's clients never follow redirects. That includes 408
Request Timeout, which Lab never sends: a client's own timeout is a network error.
"""

from __future__ import annotations

__all__ = ["is_retryable_status"]


def is_retryable_status(status: int | None) -> bool:
    """Return whether a request that ended with HTTP ``status`` may succeed if sent again.

    ``status`` is the answer's status code, or ``None`` when no answer came (a network error
    or timeout). True for ``None``, 429 and every code from 500 up; False for every other code.
    """
    return status is None or status == 429 or status >= 500
