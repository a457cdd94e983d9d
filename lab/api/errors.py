"""The one error body of the API, the HTTP status of each error code, and the DRF exception
handler that renders every error (``lab.errors.LabError`` from services, ``ApiError`` from the
API layer, DRF's and Django's own) as that body.

Body (docs/api.md "Conventions"):
``{"error": {"type", "code", "message", "param", "errors": [{"param", "code", "message"}]}}``
where ``param`` is the first bad field as a dotted path (``env.0.id``) and ``errors`` lists every
problem found.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from lab.errors import FieldError, LabError, not_found
from lab.lib.error_types import error_type

logger = logging.getLogger(__name__)



#: The HTTP status of each error code (docs/api.md "Conventions"). A LabError answers with the
#: status of its code; ``ApiError`` (the API's own refusals) names its status itself.
STATUS_BY_CODE = {
    "invalid_request": 400,
    "invalid_spec": 400,
    "invalid_run": 400,
    "invalid_environment_package": 400,
    "invalid_model": 400,
    "invalid_api_key": 401,
    "insufficient_credit": 402,
    "spend_limit_reached": 402,
    "payment_failed": 402,
    "insufficient_scope": 403,
    "permission_denied": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "idempotency_conflict": 409,
    "invalid_state": 409,
    "invalid_step": 409,
    "stale_attempt": 409,
    "attempt_not_ready": 409,
    "checkpoint_not_ready": 409,
    "adapter_not_ready": 409,
    "checkpoint_corrupted": 409,
    "adapter_corrupted": 409,
    "request_too_large": 413,
    "rate_limited": 429,
    "sandbox_capacity": 503,
}


class ApiError(LabError):
    """An error the API layer answers with: HTTP ``status``, a ``code`` from docs/api.md and a message.

    Services raise :class:`lab.errors.LabError` instead; this one is for refusals that only the
    API makes (a method a view does not serve, a header it reads). ``errors`` lists every field
    problem; ``param`` defaults to the first of them. ``headers`` are added to the response.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(code, message, param=param, errors=errors or ())
        self.status = status
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """Return the JSON error body."""
        return error_body(self.status, self.code, self.message, self.param, self.errors)


def http_status(error: LabError) -> int:
    """Return the HTTP status ``error`` answers with: its own for an ApiError, else its code's."""
    if isinstance(error, ApiError):
        return error.status
    return STATUS_BY_CODE.get(error.code, 400)


def http_headers(error: LabError) -> dict[str, str]:
    """Return the response headers ``error`` adds (``Retry-After`` when it names a delay)."""
    if isinstance(error, ApiError):
        return dict(error.headers)
    return {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else {}


def lab_error_body(error: LabError) -> dict[str, Any]:
    """Return the JSON error body of ``error``."""
    return error_body(http_status(error), error.code, error.message, error.param, error.errors)


def error_body(
    status: int, code: str, message: str, param: str | None = None, errors: list[FieldError] | None = None
) -> dict[str, Any]:
    """Return the error body for ``status`` (the ``type`` is derived from the status)."""
    return {
        "error": {
            "type": error_type(status),
            "code": code,
            "message": message,
            "param": param,
            "errors": [item.as_dict() for item in (errors or [])],
        }
    }


def error_json_response(error: LabError) -> JsonResponse:
    """Render ``error`` outside DRF (middleware, plain Django views)."""
    response = JsonResponse(lab_error_body(error), status=http_status(error))
    for name, value in http_headers(error).items():
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
    if isinstance(exc, LabError):
        return Response(lab_error_body(exc), status=http_status(exc), headers=http_headers(exc))
    if isinstance(exc, Http404):
        return Response(lab_error_body(not_found()), status=404)
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
        return Response(lab_error_body(not_found()), status=404)
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
