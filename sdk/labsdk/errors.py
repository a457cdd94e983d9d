"""Exceptions raised by the SDK, one class per kind of failure a caller may handle.

HTTP errors are built from Lab's error body (docs/api.md "Conventions"):
``{"error": {"type", "code", "message", "param", "errors": [{"param", "code", "message"}]}}``.
"""

from __future__ import annotations

import datetime
import email.utils
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labsdk.types import Job, Model

__all__ = [
    "APIConnectionError",
    "APIError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InvalidSpecError",
    "JobCancelledError",
    "JobFailedError",
    "LabError",
    "ModelCheckFailedError",
    "ModelWaitTimeoutError",
    "NotFoundError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "ProblemDetail",
    "RateLimitError",
    "RequestTooLargeError",
    "WaitTimeoutError",
    "error_from_response",
    "parse_retry_after",
]


class ProblemDetail(dict):
    """One entry of ``error.errors``: a dict with ``param``, ``code`` and ``message`` keys,
    also readable as attributes (``problem.param``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class LabError(Exception):
    """Base class of every SDK error.

    ``status_code`` is the HTTP status (``None`` when no answer came), ``code`` Lab's
    stable error code (``invalid_spec``, ``not_found``, ...), ``param`` the first bad field
    as a dotted path, ``errors`` every problem found, ``body`` the decoded answer.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        type: str | None = None,
        param: str | None = None,
        errors: list[ProblemDetail] | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code
        self.type = type
        self.param = param
        self.errors = errors or []
        self.body = body
        self.headers = headers or {}

    def __str__(self) -> str:
        prefix = f"{self.status_code} {self.code}: " if self.status_code and self.code else ""
        return prefix + self.message


class BadRequestError(LabError):
    """400: the request was refused (``invalid_request``)."""


class InvalidSpecError(BadRequestError):
    """400 ``invalid_spec``, or a spec file the SDK could not read; ``errors`` names each bad
    field by its dotted path."""


class AuthenticationError(LabError):
    """401: missing, wrong or revoked API key."""


class PaymentRequiredError(LabError):
    """402: ``insufficient_credit``, ``spend_limit_reached`` or ``payment_failed``."""


class PermissionDeniedError(LabError):
    """403: the key lacks the scope (e.g. a read key creating a job)."""


class NotFoundError(LabError):
    """404: no such object in this project (also another tenant's object)."""


class ConflictError(LabError):
    """409: ``idempotency_conflict`` or ``invalid_state`` (e.g. cancelling a finished job)."""


class RequestTooLargeError(LabError):
    """413: the body is over Lab's limit (1 MB for JSON bodies)."""


class RateLimitError(LabError):
    """429: too many requests; ``retry_after`` is the server's ``Retry-After`` in seconds."""

    @property
    def retry_after(self) -> float | None:
        """Seconds the server asked to wait, or ``None`` when it did not say."""
        return parse_retry_after(self.headers.get("retry-after"))


class APIError(LabError):
    """5xx, or any other answer the SDK does not map to a class of its own."""


class APIConnectionError(LabError):
    """No answer: the connection failed or timed out (after the client's retries)."""


def _kind(job: Job) -> str:
    """What a waited-for object is, in messages: ``job``, or its ``object`` (``evaluation``)."""
    return getattr(job, "object", None) or "job"


class JobFailedError(LabError):
    """A waited-for job (or evaluation, which runs as one) ended ``failed``; ``job`` is its final
    state (``job.error`` says why)."""

    def __init__(self, job: Job):
        reason = f"{job.error.code}: {job.error.message}" if job.error else "no reason given"
        super().__init__(f"{_kind(job)} {job.id} failed ({reason})", code=job.error.code if job.error else None)
        self.job = job


class JobCancelledError(LabError):
    """A waited-for job (or evaluation) ended ``cancelled``; ``job`` is its final state."""

    def __init__(self, job: Job):
        super().__init__(f"{_kind(job)} {job.id} was cancelled")
        self.job = job


class WaitTimeoutError(LabError):
    """A wait ran out of time; ``job`` is the last state seen of the job (or evaluation), still not finished."""

    def __init__(self, job: Job, timeout: float):
        super().__init__(
            f"{_kind(job)} {job.id} is still {job.status} after waiting {timeout:g} s"
        )
        self.job = job
        self.timeout = timeout


class ModelCheckFailedError(LabError):
    """A pushed model's check refused it; ``model`` is its last state (``model.build.error`` says why)."""

    def __init__(self, model: Model):
        build = model.build
        reason = build.error if build is not None and build.error else "no reason given"
        super().__init__(f"model {model.id}: check {build.number if build else '?'} failed: {reason}", code="invalid_model")
        self.model = model


class ModelWaitTimeoutError(LabError):
    """Waiting for a pushed model's check ran out of time; ``model`` is its last state."""

    def __init__(self, model: Model, timeout: float):
        status = model.build.status if model.build is not None else model.status
        super().__init__(f"model {model.id}: its check is still {status} after waiting {timeout:g} s")
        self.model = model
        self.timeout = timeout


def parse_retry_after(value: str | None) -> float | None:
    """Return the seconds a ``Retry-After`` header asks for (RFC 9110 §10.2.3: a number of
    seconds or an HTTP date), or ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is not None:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


_CLASS_BY_STATUS: dict[int, type[LabError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    402: PaymentRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: RequestTooLargeError,
    429: RateLimitError,
}


def error_from_response(status_code: int, body: Any, headers: dict[str, str]) -> LabError:
    """Build the exception for an HTTP error answer.

    ``body`` is the decoded JSON (or the raw text when the answer was not JSON, e.g. a
    proxy's HTML page); ``headers`` are lower-cased names. Never raises itself.
    """
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or f"HTTP {status_code}")
        code = error.get("code") if isinstance(error.get("code"), str) else None
        problems = [
            ProblemDetail({"param": None, "code": None, "message": None, **item})
            for item in error.get("errors") or []
            if isinstance(item, dict)
        ]
        param = error.get("param") if isinstance(error.get("param"), str) else None
        error_type = error.get("type") if isinstance(error.get("type"), str) else None
    else:
        text = body.strip() if isinstance(body, str) else ""
        if text.lower().startswith(("<!doctype html", "<html")):
            message = f"HTTP {status_code}: the answer is a web page, not Lab's API (is LAB_BASE_URL right?)"
        else:
            message = f"HTTP {status_code}" + (f": {text[:200]}" if text else "")
        code = param = error_type = None
        problems = []
    if status_code == 400 and code == "invalid_spec":
        cls: type[LabError] = InvalidSpecError
    else:
        cls = _CLASS_BY_STATUS.get(status_code, APIError)
    return cls(
        message, status_code=status_code, code=code, type=error_type, param=param,
        errors=problems, body=body, headers=headers,
    )
