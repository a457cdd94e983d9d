"""Hostile engine bodies on the ingest API (docs/ingest-api.md): a pod uid or JobSet name that
is no Kubernetes name on ``POST /attempts`` (a NUL one was a 500), and counts of the wrong JSON
type ("1", 1.0, true for a step, an attempt or a size), which were read as numbers; each is a 400
``invalid_request`` that changes nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from rest_framework.test import APIClient

from jobs import storage
from jobs.ingest.tokens import bootstrap_token, job_token
from jobs.models import Adapter, Checkpoint, JobAttempt, LogLine, MetricStep
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "objects")}},
    }


def client(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


@pytest.mark.parametrize("body", [
    {"pod_uid": "uid-1\x00", "jobset": "js-1"},
    {"pod_uid": "uid-1", "jobset": "js-1\x00"},
    {"pod_uid": "uid 1", "jobset": "js-1"},
    {"pod_uid": "uid-1\n", "jobset": "js-1"},
    {"pod_uid": "../uid", "jobset": "js-1"},
])
def test_a_pod_uid_or_jobset_that_is_no_kubernetes_name_is_a_400_that_opens_nothing(owner, spec, settings, body):
    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL_CONFIGURED = True
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state="launched", handle={"namespace": "lab-acme", "jobset": "js-1"})

    answer = client(bootstrap_token(attempt)).post(f"/api/v1/ingest/jobs/{job.public_id}/attempts", body, format="json")

    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request"), answer.content
    assert JobAttempt.objects.get(pk=attempt.pk).handle == {"namespace": "lab-acme", "jobset": "js-1"}


@pytest.fixture
def engine(owner, spec):
    spec["adapters"] = {"interval": 1}
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    return job, client(job_token(attempt)), f"/api/v1/ingest/jobs/{job.public_id}"


NOW = datetime(2026, 1, 1, tzinfo=timezone.utc).isoformat()


@pytest.mark.parametrize("count", ["1", 1.0, True])
@pytest.mark.parametrize(("route", "body", "param"), [
    ("adapters", {"attempt": 1, "step": "COUNT", "format": "peft-lora"}, "step"),
    ("adapters", {"attempt": "COUNT", "step": 1, "format": "peft-lora"}, "attempt"),
    ("checkpoints", {"attempt": 1, "step": "COUNT", "format": "peft-lora"}, "step"),
    ("metrics", {"attempt": 1, "points": [{"step": "COUNT", "time": NOW, "values": {"loss": 1.0}}]}, "points.0.step"),
    ("logs", {"attempt": 1, "lines": [{"seq": "COUNT", "time": NOW, "line": "x"}]}, "lines.0.seq"),
    ("status", {"attempt": 1, "phase": "running", "step": "COUNT"}, "step"),
])
def test_a_count_of_the_wrong_json_type_is_a_400_that_stores_nothing(engine, count, route, body, param):
    job, api, base = engine
    body = {key: count if value == "COUNT" else value for key, value in body.items()}
    for key in ("points", "lines"):
        if key in body:
            body[key] = [{name: count if value == "COUNT" else value for name, value in item.items()} for item in body[key]]

    answer = api.post(f"{base}/{route}", body, format="json")

    assert answer.status_code == 400, answer.content
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == ("invalid_request", param)
    assert not Adapter.objects.unscoped().filter(job=job).exists()
    assert not Checkpoint.objects.unscoped().filter(job=job).exists()
    assert not MetricStep.objects.filter(job=job).exists() and not LogLine.objects.filter(job=job).exists()
    assert list(storage.iter_objects()) == []


@pytest.mark.parametrize("size", ["3", 3.0, True])
def test_an_adapter_completion_with_a_size_of_the_wrong_type_is_a_400_that_changes_nothing(engine, size):
    job, api, base = engine
    registered = api.post(f"{base}/adapters", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()

    answer = api.post(f"{base}/adapters/{registered['id']}/complete", {"size_bytes": size, "sha256": "0" * 64}, format="json")

    assert (answer.status_code, answer.json()["error"]["param"]) == (400, "size_bytes"), answer.content
    assert list(Adapter.objects.unscoped().filter(job=job).values_list("status", flat=True)) == ["uploading"]
