"""The ``type`` of an error body for each HTTP status (docs/api.md "Errors"): one table for Lab's
API (``lab.api.errors``), its OpenAI-compatible gateway and the sandbox agent's data plane, which
answer errors with the same body. No Django: the agent imports it."""

from __future__ import annotations

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "payment_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    406: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """Return the error ``type`` of HTTP ``status``: the table's, else ``api_error`` for a 5xx and
    ``invalid_request_error`` for any other."""
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
