"""Request middleware: request ids, Prometheus request metrics, the request body limit.

Each class works under WSGI and ASGI (sync and async), since the live stream is an async view.
"""

from __future__ import annotations

import re
import time
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from whitenoise.middleware import WhiteNoiseMiddleware

from lab.api.errors import ApiError, error_json_response
from lab.logging import request_id_var
from lab.metrics import REQUEST_LATENCY, REQUESTS

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class _Middleware:
    """Run ``before`` and ``after`` around the view, in sync or async mode as the stack needs."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        early = self.before(request)
        if early is not None:
            return self.after(request, early)
        return self.after(request, self.get_response(request))

    async def _acall(self, request):
        early = self.before(request)
        if early is not None:
            return self.after(request, early)
        return self.after(request, await self.get_response(request))

    def before(self, request):
        return None

    def after(self, request, response):
        return response


class StaticFilesMiddleware(_Middleware):
    """WhiteNoise's static files (``STATIC_URL``), served as its own middleware serves them, in a
    middleware that runs async too: WhiteNoise's is sync only, which would make Django run every
    async view (the live stream, the OpenAI-compatible API) through a thread and back."""

    def __init__(self, get_response):
        super().__init__(get_response)
        self._whitenoise = WhiteNoiseMiddleware(get_response)

    def before(self, request):
        whitenoise = self._whitenoise
        found = whitenoise.find_file(request.path_info) if whitenoise.autorefresh else whitenoise.files.get(request.path_info)
        return None if found is None else whitenoise.serve(found, request)


class RequestIdMiddleware(_Middleware):
    """Take a sane ``X-Request-Id`` from the client or make one; echo it on every response."""

    def before(self, request):
        incoming = request.headers.get("X-Request-Id", "")
        request.request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        request_id_var.set(request.request_id)
        return None

    def after(self, request, response):
        response["X-Request-Id"] = request.request_id
        return response


def _route_label(request) -> str:
    match = getattr(request, "resolver_match", None)
    return match.route if match is not None and match.route else "unmatched"


class PrometheusMiddleware(_Middleware):
    """Count requests and time them by route (the URL pattern, not the raw path) and status."""

    def before(self, request):
        request._lab_started = time.perf_counter()
        return None

    def after(self, request, response):
        route = _route_label(request)
        REQUESTS.labels(method=request.method, route=route, status=str(response.status_code)).inc()
        REQUEST_LATENCY.labels(method=request.method, route=route).observe(time.perf_counter() - request._lab_started)
        return response


def max_request_bytes(path: str) -> int:
    """Return the largest body accepted on ``path``: 1 MB, except environment wheel uploads
    (``LAB_MAX_UPLOAD_REQUEST_BYTES``: a 100 MB wheel and its multipart framing), model archive
    pushes (``LAB_MODEL_MAX_BYTES`` and the framing) and Prime's evaluation sample uploads
    (``LAB_PRIME_SAMPLES_MAX_BYTES``: the 25 MB batches of ``prime_evals``)."""
    if re.match(settings.LAB_PRIME_SAMPLES_PATH_PATTERN, path):
        return settings.LAB_PRIME_SAMPLES_MAX_BYTES
    if re.match(settings.LAB_MODEL_UPLOAD_PATH_PATTERN, path):
        return settings.LAB_MODEL_MAX_BYTES + 64 * 1024
    if re.match(settings.LAB_UPLOAD_PATH_PATTERN, path):
        return settings.LAB_MAX_UPLOAD_REQUEST_BYTES
    return settings.LAB_MAX_REQUEST_BYTES


class BodySizeLimitMiddleware(_Middleware):
    """Refuse a body over the limit with 413: by its declared length before it is read, or, for a
    chunked body without Content-Length, by what arrived (and then declare its length, since DRF
    reads a body without Content-Length as empty)."""

    def before(self, request):
        limit = max_request_bytes(request.path)
        too_large = ApiError(413, "request_too_large", f"The request body is larger than {limit // (1024 * 1024)} MB.")
        declared = request.META.get("CONTENT_LENGTH")
        if declared:
            try:
                length = int(declared)
            except ValueError:
                return error_json_response(ApiError(400, "invalid_request", "Content-Length is not a number."))
            return error_json_response(too_large) if length > limit else None
        if request.method in ("POST", "PUT", "PATCH") and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", ""):
            try:
                body = request.body
            except RequestDataTooBig:
                return error_json_response(too_large)
            if len(body) > limit:
                return error_json_response(too_large)
            request.META["CONTENT_LENGTH"] = str(len(body))
        return None


class NulCharacterMiddleware(_Middleware):
    """Refuse NUL characters in the path or query string (no database can store them) with 400."""

    def before(self, request):
        if "\x00" in request.path or any("\x00" in key or "\x00" in value for key, value in request.GET.items()):
            return error_json_response(
                ApiError(400, "invalid_request", "NUL characters are not allowed in the path or the query string.")
            )
        return None
