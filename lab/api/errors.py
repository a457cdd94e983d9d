"""The one error body of the API and the DRF exception handler that produces it.

Body (docs/api.md "Conventions"):
``{"error": {"type", "code", "message", "param", "errors": [{"param", "code", "message"}]}}``
where ``param`` is the first bad field as a dotted path (``env.0.id``) and ``errors`` lists every
problem found.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: ``param`` is a dotted path, ``code`` a stable identifier."""

    param: str | None
    code: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON shape used in ``error.errors``."""
        return {"param": self.param, "code": self.code, "message": self.message}


@dataclass
class ApiError(Exception):
    """An error the API answers with: HTTP ``status``, a ``code`` from docs/api.md and a message.

    ``errors`` lists every field problem; ``param`` defaults to the first of them.
    ``headers`` are added to the response (e.g. ``Retry-After``).
    """

    status: int
    code: str
    message: str
    param: str | None = None
    errors: list[FieldError] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.param is None and self.errors:
            self.param = self.errors[0].param

    def body(self) -> dict[str, Any]:
        """Return the JSON error body."""
        return error_body(self.status, self.code, self.message, self.param, self.errors)


def not_found(what: str = "object") -> ApiError:
    """Return the 404 used for missing objects and for other tenants' objects alike."""
    return ApiError(404, "not_found", f"No such {what}.")


def error_body(
    status: int, code: str, message: str, param: str | None = None, errors: list[FieldError] | None = None
) -> dict[str, Any]:
    """Return the error body for ``status`` (the ``type`` is derived from the status)."""
    error_type = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {
        "error": {
            "type": error_type,
            "code": code,
            "message": message,
            "param": param,
            "errors": [item.as_dict() for item in (errors or [])],
        }
    }


def error_json_response(error: ApiError) -> JsonResponse:
    """Render ``error`` outside DRF (middleware, plain Django views)."""
    response = JsonResponse(error.body(), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def _flatten_validation(detail: Any, prefix: str = "") -> list[FieldError]:
    """Turn DRF's nested ValidationError detail into a flat list of dotted-path field errors."""
    if isinstance(detail, dict):
        found: list[FieldError] = []
        for key, value in detail.items():
            path = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
            found.extend(_flatten_validation(value, path))
        return found
    if isinstance(detail, list):
        found = []
        for index, value in enumerate(detail):
            if isinstance(value, (dict, list)):
                found.extend(_flatten_validation(value, f"{prefix}.{index}" if prefix else str(index)))
            else:
                found.extend(_flatten_validation(value, prefix))
        return found
    code = getattr(detail, "code", "invalid") or "invalid"
    return [FieldError(param=prefix or None, code=str(code), message=str(detail))]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: every error leaves as the body above, never as a bare 500 page."""
    if isinstance(exc, ApiError):
        return Response(exc.body(), status=exc.status, headers=exc.headers)
    if isinstance(exc, Http404):
        return Response(not_found().body(), status=404)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body(413, "request_too_large", "The request body is larger than 1 MB."), status=413)
    if isinstance(exc, drf_exceptions.ParseError):
        return Response(error_body(400, "invalid_request", f"Malformed request body: {exc.detail}"), status=400)
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        return Response(error_body(415, "unsupported_media_type", str(exc.detail)), status=415)
    if isinstance(exc, drf_exceptions.ValidationError):
        errors = _flatten_validation(exc.detail)
        message = errors[0].message if len(errors) == 1 else f"{len(errors)} problems in the request."
        return Response(error_body(400, "invalid_request", message, errors[0].param if errors else None, errors), status=400)
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        response = Response(
            error_body(401, "invalid_api_key", str(exc.detail)), status=401, headers={"WWW-Authenticate": "Bearer"}
        )
        return response
    if isinstance(exc, drf_exceptions.PermissionDenied):
        return Response(error_body(403, "insufficient_scope", str(exc.detail)), status=403)
    if isinstance(exc, drf_exceptions.NotFound):
        return Response(not_found().body(), status=404)
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return Response(error_body(405, "method_not_allowed", str(exc.detail)), status=405)
    if isinstance(exc, drf_exceptions.NotAcceptable):
        return Response(error_body(406, "not_acceptable", str(exc.detail)), status=406)
    if isinstance(exc, drf_exceptions.Throttled):
        wait = max(1, int(exc.wait or 1))
        return Response(
            error_body(429, "rate_limited", f"Too many requests; retry in {wait} s."),
            status=429,
            headers={"Retry-After": str(wait)},
        )
    if isinstance(exc, drf_exceptions.APIException):
        return Response(error_body(exc.status_code, "api_error", str(exc.detail)), status=exc.status_code)
    logger.exception("unhandled error in API view", extra={"view": type(context.get("view")).__name__})
    return Response(error_body(500, "internal_error", "An internal error occurred; it has been logged."), status=500)
