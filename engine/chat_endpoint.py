"""An OpenAI-compatible chat endpoint outside the engine, as a job's `[teacher]` (engine.distill)
and an evaluation's `[eval.endpoint]` (engine.endpoint_sampling) reach it: one httpx client with
the request's headers (the API key as `Authorization: Bearer ...`), no redirects followed, through
the local launcher's relay in its sandbox (engine.egress), each request retried on network errors,
429 and 5xx with capped backoff (engine.http_retry) and refused at once on any other 4xx.

A subclass names its errors: `refused` (a configuration error, exit 2) and `unavailable` (a
crash Lab retries as a new attempt), and how its messages name the endpoint (`description`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import httpx

from engine import egress
from engine.http_retry import RetriesExhausted, request_json

#: Seconds one request may take.
REQUEST_TIMEOUT_S = 300.0
#: Attempts per request (network errors, 429 and 5xx are retried with capped backoff).
ATTEMPTS = 5
#: Longest wait between attempts, in seconds (also the cap on a 429's Retry-After).
MAX_BACKOFF_S = 30.0


class ChatEndpoint:
    """Requests to one model on an OpenAI-compatible endpoint.

    `base_url` is the endpoint's base (`https://host/v1`; paths such as `/chat/completions` are
    appended). `headers` are sent with every request. `sleep` is injectable so tests need not wait.
    """

    #: The exception a refused request raises (4xx other than 429).
    refused: type[Exception] = RuntimeError
    #: The exception raised once every attempt failed.
    unavailable: type[Exception] = RuntimeError
    #: Who is asked, in http_retry's log lines.
    what = "endpoint"

    def __init__(
        self, *, base_url: str, model: str, headers: Mapping[str, str], timeout: float = REQUEST_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._sleep = sleep
        self._client = httpx.Client(
            headers=dict(headers), timeout=timeout, follow_redirects=False, transport=transport or egress.transport()
        )

    @property
    def description(self) -> str:
        """How error messages name the endpoint."""
        return f"the endpoint {self.base_url}"

    def close(self) -> None:
        """Close the HTTP connections; safe to call twice."""
        self._client.close()

    def request(self, method: str, path: str, body: dict | None = None) -> object:
        """Return the JSON answer of `method path` (with `body` as JSON). Raises `refused` on a
        4xx other than 429, `unavailable` once ATTEMPTS attempts failed."""
        def refuse(response: httpx.Response) -> Exception:
            return self.refused(
                f"{self.description} refused {method} {path} with HTTP {response.status_code}: {error_message(response)}"
            )

        try:
            return request_json(
                self._client, method, self.base_url + path, body, attempts=ATTEMPTS, max_backoff=MAX_BACKOFF_S,
                refuse=refuse, what=self.what, sleep=self._sleep,
            )
        except RetriesExhausted as error:
            raise self.unavailable(f"{self.description} failed {ATTEMPTS} times on {method} {path}: {error}") from None


def error_message(response: httpx.Response) -> str:
    """The message of an OpenAI-style error body, else the body's start (never the request)."""
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:300]
    except (ValueError, AttributeError):
        pass
    return response.text[:300]
