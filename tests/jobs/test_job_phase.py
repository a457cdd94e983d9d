"""The Job object carries the engine's phase from its latest heartbeat while the job starts or
runs, so progress bars can say ``loading`` or ``checkpointing`` instead of a bare status."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs.ingest.tokens import job_token
from jobs.models import Job
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


def started(owner, spec) -> tuple[Job, APIClient]:
    """Submit ``spec`` and claim its first attempt; return the job and its engine's client."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return job, engine


def heartbeat(client: APIClient, job: Job, phase: str, step: int) -> None:
    answer = client.post(f"/api/v1/ingest/jobs/{job.public_id}/status",
                         {"attempt": 1, "phase": phase, "step": step}, format="json")
    assert answer.status_code == 200, answer.content


def test_it_reports_the_phase_of_the_current_attempt(owner, spec):
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    api = owner.client()
    queued = api.get(f"/api/v1/jobs/{job.public_id}").json()
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")

    claimed = api.get(f"/api/v1/jobs/{job.public_id}").json()
    heartbeat(engine, job, "loading", 0)
    loading = api.get(f"/api/v1/jobs/{job.public_id}").json()
    heartbeat(engine, job, "checkpointing", 2)
    checkpointing = api.get(f"/api/v1/jobs/{job.public_id}").json()
    listed = api.get("/api/v1/jobs").json()["data"][0]

    assert (queued["status"], queued["phase"]) == ("queued", None)
    assert (claimed["status"], claimed["phase"]) == ("starting", None)  # no heartbeat yet
    assert (loading["status"], loading["phase"]) == ("starting", "loading")
    assert (checkpointing["status"], checkpointing["phase"], checkpointing["step"]) == ("running", "checkpointing", 2)
    assert listed["phase"] == "checkpointing"
    document = served_document()
    for body in (queued, loading, checkpointing):
        assert_matches(document, "Job", body)


def test_a_finished_job_has_no_phase(owner, spec):
    job, engine = started(owner, spec)
    heartbeat(engine, job, "running", 1)
    owner.client().post(f"/api/v1/jobs/{job.public_id}/cancel")
    heartbeat(engine, job, "finishing", 1)

    body = owner.client().get(f"/api/v1/jobs/{job.public_id}").json()

    assert body["status"] == "cancelling" and body["phase"] == "finishing"
    Job.objects.unscoped().filter(pk=job.pk).update(status="cancelled")
    assert owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["phase"] is None


def test_a_loading_heartbeat_overtaken_by_a_step_is_not_reported(owner, spec):
    job, engine = started(owner, spec)
    heartbeat(engine, job, "loading", 0)
    points = {"attempt": 1, "points": [{"step": 1, "time": "2026-11-29T22:16:31Z", "values": {"reward/mean": 0.5}}]}
    assert engine.post(f"/api/v1/ingest/jobs/{job.public_id}/metrics", points, format="json").status_code == 200

    body = owner.client().get(f"/api/v1/jobs/{job.public_id}").json()

    assert (body["status"], body["step"], body["phase"]) == ("running", 1, None)
