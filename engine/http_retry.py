"""One JSON request with retries, for the engine's calls to services it depends on (a teacher
endpoint, an inference role): network errors, 429 and 5xx are retried with capped exponential
backoff (a 429's or 503's `Retry-After` is honoured up to the cap); any other 4xx is the
caller's to refuse at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx
from labsdk.retry import exponential_backoff

logger = logging.getLogger("engine")


class RetriesExhausted(Exception):
    """Every attempt failed; the message says how the last one did."""


def request_json(
    client: httpx.Client, method: str, url: str, body: dict | None = None, *, attempts: int, max_backoff: float,
    refuse: Callable[[httpx.Response], Exception], what: str, before_attempt: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> object:
    """Send `method url` with the JSON `body` up to `attempts` times and return the decoded answer.

    Waits 0.5 s, 1 s, 2 s, ... (at most `max_backoff` s) between attempts. A 4xx other than 429
    raises `refuse(response)` without retrying; `before_attempt` runs before each attempt (it may
    raise to stop early); `what` names the service in the retry log lines. Raises
    RetriesExhausted when the last attempt fails.
    """
    problem = ""
    for attempt in range(1, attempts + 1):
        if before_attempt is not None:
            before_attempt()
        wait = exponential_backoff(attempt - 1, base=0.5, cap=max_backoff)
        try:
            response = client.request(method, url, json=body)
        except httpx.HTTPError as error:
            problem = f"{type(error).__name__}: {error}"
        else:
            if response.status_code < 300:
                try:
                    return response.json()
                except ValueError:
                    problem = f"HTTP {response.status_code} with a body that is not JSON"
            elif response.status_code == 429 or response.status_code >= 500:
                problem = f"HTTP {response.status_code}"
                wait = min(max_backoff, max(wait, _retry_after(response)))
            else:
                raise refuse(response)
        if attempt < attempts:
            logger.warning("%s %s %s failed (%s); retrying in %.1fs", what, method, url, problem, wait)
            sleep(wait)
    raise RetriesExhausted(problem)


def _retry_after(response: httpx.Response) -> float:
    try:
        return float(response.headers.get("Retry-After", "0"))
    except ValueError:
        return 0.0
