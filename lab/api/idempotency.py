"""``Idempotency-Key`` for POSTs (docs/api.md): a replay returns the original status and body.

Keys are per project and kept 24 hours (``lab.idempotency``, which the dashboard's submission
tokens use too). The same key with a different request (method, path or body) is 409
``idempotency_conflict``. A request that fails with an error (or a 5xx) stores nothing and can be
retried with the same key; of two concurrent requests with one key the second replays the first's
answer.

One exception: an answer that shows a secret once (a webhook endpoint's ``whsec_...`` on create
and rotate) names, with ``replay_as(response, body)``, the body to store and replay instead,
so the secret is never written to the idempotency table nor answered twice.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable

from django.conf import settings
from rest_framework.response import Response

from lab.api.errors import ApiError
from lab.idempotency import StoredAnswer, run_once
from lab.models import Project

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


def _replayed(stored: StoredAnswer) -> Response:
    response = Response(stored.body, status=stored.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


def _answer(response: Response) -> StoredAnswer | None:
    if response.status_code >= 500:
        return None
    return StoredAnswer(response.status_code, getattr(response, _REPLAY_BODY, response.data))


def run_idempotently(request, project: Project, handler: Callable[[], Response]) -> Response:
    """Run ``handler`` once per (project, Idempotency-Key); replay its answer afterwards
    (``lab.idempotency.run_once``).

    Without the header, ``handler`` simply runs. Raises ApiError 400 for an over-long key and
    ``idempotency_conflict`` (409) for a key reused with another request.
    """
    key = request.headers.get(HEADER)
    if key is None:
        return handler()
    if not key or len(key) > _MAX_KEY_LENGTH:
        raise ApiError(400, "invalid_request", f"{HEADER} must be 1 to {_MAX_KEY_LENGTH} characters.", param=HEADER)
    result = run_once(
        project=project, key=key, request_hash=_request_hash(request), work=handler, answer=_answer, param=HEADER
    )
    return _replayed(result) if isinstance(result, StoredAnswer) else result


def idempotent(method: Callable) -> Callable:
    """Wrap a view's ``post`` so it honours ``Idempotency-Key`` for ``self.project``."""

    @functools.wraps(method)
    def wrapper(self, request, *args, **kwargs):
        return run_idempotently(request, self.project, lambda: method(self, request, *args, **kwargs))

    wrapper.is_idempotent = True
    return wrapper
