"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


def test_it_answers_healthz():
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_it_answers_readyz_when_database_and_broker_answer():
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_is_503_when_the_broker_is_down(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "checks": {"database": "ok", "broker": "failed"}}


def test_it_exposes_request_metrics():
    Client().get("/healthz")
    body = Client().get("/metrics").content.decode()
    assert 'lab_http_requests_total{method="GET",route="healthz",status="200"}' in body
    assert "lab_http_request_duration_seconds_bucket" in body


@override_settings(LAB_MAX_REQUEST_BYTES=10)
def test_a_declared_oversized_body_is_refused_before_it_is_read():
    response = Client().post("/healthz", data="x" * 11, content_type="text/plain")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_it_exposes_job_gauges(owner):
    from jobs.metrics import record_admission_pass
    from jobs.models import Job

    Job.objects.create(project=owner.project, spec={}, max_steps=1, model="m")
    record_admission_pass(12.5)
    body = Client().get("/metrics").content.decode()
    assert 'lab_jobs{status="queued"} 1.0' in body
    assert 'lab_jobs{status="running"} 0.0' in body
    assert "lab_admission_last_pass_milliseconds 12.5" in body
