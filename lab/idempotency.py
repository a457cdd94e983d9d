"""Run a request once per (project, idempotency key) and answer a repeat as the first time.

One service for every caller that must not do a thing twice: the API's ``Idempotency-Key``
(``lab.api.idempotency``, docs/api.md) and the dashboard's submission tokens. Keys are kept
``LAB_IDEMPOTENCY_TTL_S`` (24 hours). The stored answer is written in the same transaction as the
work it describes, so work that fails stores nothing and may be tried again with the same key; two
concurrent requests with one key are serialized by an advisory lock on (project, key) held until
that transaction ends, so the second waits for the first and is answered with its stored answer
(were it to run its work meanwhile, it would meet the first's results as a conflict of its own,
such as a name already taken).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from lab.errors import LabError
from lab.lib.locks import IDEMPOTENCY, advisory_xact_lock
from lab.models import IdempotencyRecord, Project

T = TypeVar("T")


@dataclass(frozen=True)
class StoredAnswer:
    """What the first request with a key answered: an HTTP-style status and a JSON body."""

    status_code: int
    body: Any


def run_once(
    *,
    project: Project,
    key: str,
    request_hash: str,
    work: Callable[[], T],
    answer: Callable[[T], StoredAnswer | None],
    param: str | None = None,
) -> T | StoredAnswer:
    """Run ``work`` once per ``(project, key)``; return its result, or the stored answer of an earlier run.

    ``answer(result)`` says what to store for a repeat (None stores nothing: a server error, which
    may be retried). ``request_hash`` identifies the request: a repeat with another hash raises
    ``idempotency_conflict`` (``param`` names the key's field, e.g. the ``Idempotency-Key``
    header). A repeat that arrives while the first still runs waits for it to end. Errors ``work``
    raises propagate and store nothing.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.LAB_IDEMPOTENCY_TTL_S)
    IdempotencyRecord.objects.filter(project=project, key=key, created_at__lt=cutoff).delete()
    try:
        with transaction.atomic():
            advisory_xact_lock(IDEMPOTENCY, _lock_key(project.pk, key))
            existing = IdempotencyRecord.objects.filter(project=project, key=key).first()
            if existing is not None:  # a repeat, or a concurrent request with this key that committed first
                return _stored(existing, request_hash, param)
            result = work()
            stored = answer(result)
            if stored is not None:
                IdempotencyRecord.objects.create(
                    project=project,
                    key=key,
                    request_hash=request_hash,
                    status_code=stored.status_code,
                    response_body=stored.body,
                )
            return result
    except IntegrityError:
        # Another request with this key committed first: answer as it did.
        existing = IdempotencyRecord.objects.filter(project=project, key=key).first()
        if existing is None:
            raise LabError(
                "idempotency_conflict",
                f"Another request with this {param or 'key'} is in progress; retry it shortly.",
                param=param,
            ) from None
        return _stored(existing, request_hash, param)


def _lock_key(project_id: int, key: str) -> int:
    """The advisory lock's second key for ``(project_id, key)``: a signed 32-bit hash (two pairs
    that share it only wait for each other)."""
    value = zlib.crc32(f"{project_id}:{key}".encode("utf-8", "surrogatepass"))
    return value - (1 << 32) if value >= 1 << 31 else value


def _stored(record: IdempotencyRecord, request_hash: str, param: str | None) -> StoredAnswer:
    if record.request_hash != request_hash:
        message = f"This {param or 'key'} was already used with a different request."
        raise LabError("idempotency_conflict", message, param=param)
    return StoredAnswer(status_code=record.status_code, body=record.response_body)


def purge_expired_idempotency_records() -> int:
    """Delete records older than the ``LAB_IDEMPOTENCY_TTL_S`` window; return how many were deleted."""
    cutoff = timezone.now() - timedelta(seconds=settings.LAB_IDEMPOTENCY_TTL_S)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
