"""What is worth sending again over HTTP, and how long to wait first: the rules the SDK, the
engine and Lab share.

STYLE.md §6: retry only network errors, 429 and 5xx. A request that got no answer (refused or
reset connection, timeout) may never have arrived, or its answer was lost; 429 Too Many
Requests (RFC 6585 §4) and the 5xx server errors (RFC 9110 §15.6) say the server cannot answer
now. Any other answer is the server's word on this request and a resend gets the same one:
the other 4xx refusals, and 3xx, since Lab's clients never follow redirects. That includes 408
Request Timeout, which Lab never sends: a client's own timeout is a network error.

Between tries the wait grows exponentially up to a cap (``exponential_backoff``), with "equal
jitter" where many clients may fail at once ("Exponential Backoff And Jitter", AWS Architecture
Blog, 2015); a ``Retry-After`` the server sends is each caller's to honour.
"""

from __future__ import annotations

import random

__all__ = ["exponential_backoff", "is_retryable_status"]

#: Past this many doublings the wait is the cap for any base above a nanosecond; it keeps
#: ``2**retry`` from overflowing a float.
_MAX_DOUBLINGS = 64


def is_retryable_status(status: int | None) -> bool:
    """Return whether a request that ended with HTTP ``status`` may succeed if sent again.

    ``status`` is the answer's status code, or ``None`` when no answer came (a network error
    or timeout). True for ``None``, 429 and every code from 500 up; False for every other code.
    """
    return status is None or status == 429 or status >= 500


def exponential_backoff(retry: int, *, base: float, cap: float, jitter: bool = False) -> float:
    """Return the seconds to wait before retry number ``retry`` (0 before the first retry).

    ``base`` seconds doubled ``retry`` times, at most ``cap`` seconds: ``min(cap, base * 2**retry)``.
    With ``jitter`` the wait is scaled by a random factor in [0.5, 1], so clients that failed
    together do not all come back together.
    """
    wait = min(cap, base * 2 ** min(retry, _MAX_DOUBLINGS))
    return wait * random.uniform(0.5, 1.0) if jitter else wait
