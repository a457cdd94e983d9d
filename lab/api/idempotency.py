"""``Idempotency-Key`` for POSTs (docs/api.md): a replay returns the original status and body.

Keys are per project and kept 24 hours. The same key with a different request (method, path or
body) is 409 ``idempotency_conflict``. The stored answer is written in the same transaction as
the work it describes, so a request that fails with an error (or a 5xx) stores nothing and can be
retried with the same key; two concurrent requests with one key are serialized by the unique
constraint, and the second replays the first's answer.

One exception: an answer that shows a secret once (a webhook endpoint's ``whsec_...`` on create
and rotate) names, with ``replay_as(response, body)``, the body to store and replay instead,
so the secret is never written to the idempotency table nor answered twice.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.response import Response

from lab.api.errors import ApiError
from lab.models import IdempotencyRecord, Project

HEADER = "Idempotency-Key"
_MAX_KEY_LENGTH = 255
_REPLAY_BODY = "lab_replay_body"


def replay_as(response: Response, body: dict) -> Response:
    """Mark ``response`` so ``body`` (the answer less what is shown once) is stored and replayed.

    Use it for answers that carry a secret: the live answer shows it, a replay of the same
    ``Idempotency-Key`` answers the original status with ``body`` instead. Returns ``response``.
    """
    setattr(response, _REPLAY_BODY, body)
    return response


def _request_hash(request) -> str:
    # Keyed (HMAC-SHA256 under SECRET_KEY): a body may carry write-only secrets (a job's
    # ``secrets``), and a plain hash of a known body would let its secrets be guessed offline.
    digest = hmac.new(settings.SECRET_KEY.encode(), digestmod=hashlib.sha256)
    digest.update(request.method.encode())
    digest.update(b"\0")
    digest.update(request.path.encode())
    digest.update(b"\0")
    digest.update(request.body)
    return digest.hexdigest()


def _replay(record: IdempotencyRecord, request_hash: str) -> Response:
    if record.request_hash != request_hash:
        raise ApiError(
            409,
            "idempotency_conflict",
            "This Idempotency-Key was already used with a different request.",
            param=HEADER,
        )
    response = Response(record.response_body, status=record.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


def run_idempotently(request, project: Project, handler: Callable[[], Response]) -> Response:
    """Run ``handler`` once per (project, Idempotency-Key); replay its answer afterwards.

    Without the header, ``handler`` simply runs. Raises ApiError 400 for an over-long key and 409
    for a key reused with another request.
    """
    key = request.headers.get(HEADER)
    if key is None:
        return handler()
    if not key or len(key) > _MAX_KEY_LENGTH:
        raise ApiError(400, "invalid_request", f"{HEADER} must be 1 to {_MAX_KEY_LENGTH} characters.", param=HEADER)
    request_hash = _request_hash(request)
    cutoff = timezone.now() - timedelta(seconds=settings.LAB_IDEMPOTENCY_TTL_S)
    IdempotencyRecord.objects.filter(project=project, key=key, created_at__lt=cutoff).delete()
    existing = IdempotencyRecord.objects.filter(project=project, key=key).first()
    if existing is not None:
        return _replay(existing, request_hash)
    try:
        with transaction.atomic():
            response = handler()
            if response.status_code < 500:
                IdempotencyRecord.objects.create(
                    project=project,
                    key=key,
                    request_hash=request_hash,
                    status_code=response.status_code,
                    response_body=getattr(response, _REPLAY_BODY, response.data),
                )
            return response
    except IntegrityError:
        # Another request with this key committed first: answer as it did.
        existing = IdempotencyRecord.objects.filter(project=project, key=key).first()
        if existing is None:
            raise ApiError(
                409,
                "idempotency_conflict",
                "Another request with this Idempotency-Key is in progress; retry it shortly.",
                param=HEADER,
            ) from None
        return _replay(existing, request_hash)


def idempotent(method: Callable) -> Callable:
    """Wrap a view's ``post`` so it honours ``Idempotency-Key`` for ``self.project``."""

    @functools.wraps(method)
    def wrapper(self, request, *args, **kwargs):
        return run_idempotently(request, self.project, lambda: method(self, request, *args, **kwargs))

    wrapper.is_idempotent = True
    return wrapper


def purge_expired_idempotency_records() -> int:
    """Delete records older than the 24-hour window; return how many were deleted."""
    cutoff = timezone.now() - timedelta(seconds=settings.LAB_IDEMPOTENCY_TTL_S)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
