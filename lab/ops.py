"""Operational endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from kombu import Connection
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

logger = logging.getLogger(__name__)


@require_GET
def healthz(request) -> JsonResponse:
    """Answer 200 while the process serves requests."""
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "not ready"
        return f"{type(exc).__name__}: {exc}"
    return None


def _check_broker() -> str | None:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as broker:
            broker.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:  # any transport error means "not ready"
        return f"{type(exc).__name__}: {exc}"
    return None


@require_GET
def readyz(request) -> JsonResponse:
    """Answer 200 when the database and the broker answer, 503 naming what does not."""
    checks = {"database": _check_database(), "broker": _check_broker()}
    failed = {name: error for name, error in checks.items() if error}
    for name, error in failed.items():
        logger.warning("readiness check failed", extra={"check": name, "error": error})
    body = {"status": "ok" if not failed else "unavailable", "checks": {n: ("ok" if not e else "failed") for n, e in checks.items()}}
    return JsonResponse(body, status=200 if not failed else 503)


@require_GET
def metrics(request) -> HttpResponse:
    """Prometheus exposition of this process's metrics."""
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
