"""Helpers of the tests of a job's sandboxes: a launched attempt with its engine's client, the
attempt's sandbox key, a tiny `lab/python-code` spec, and what the session's agent holds."""

from __future__ import annotations

from rest_framework.test import APIClient

from jobs.ingest.tokens import job_token
from jobs.models import AttemptState, JobAttempt
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from sandboxes.models import ACTIVE_STATUSES, Sandbox
from sandboxes.services import sandbox_spec


def launched_attempt(owner, spec) -> tuple[JobAttempt, APIClient]:
    """A job whose attempt 1 is launched, and the client of its job token (the engine's)."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.LAUNCHED)
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return attempt, engine


def attempt_sandbox_key(attempt: JobAttempt, engine: APIClient) -> dict:
    """What the engine gets from ``POST sandbox-key``: ``{"api_key", "base_url", "data_plane_url"}``."""
    answer = engine.post(f"/api/v1/ingest/jobs/{attempt.job.public_id}/sandbox-key", {}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def stop_active_sandboxes(runtime) -> None:
    """Stop on the session's agent the sandboxes a test left running (its rows outlive the test)."""
    for sandbox in Sandbox.objects.unscoped().filter(status__in=ACTIVE_STATUSES):
        runtime.destroy(sandbox_spec(sandbox))


def held(runtime) -> frozenset[str]:
    """The ids of the sandboxes the session's agent holds."""
    return runtime.held()[1]


def code_spec(spec: dict, **changes) -> dict:
    """A tiny-model job on `lab/python-code`: 2 steps of 4 rollouts, programs of 16 tokens."""
    spec.update(
        name="python-code-tiny", max_steps=2, batch_size=4, rollouts_per_example=2, sampling={"max_tokens": 16},
        env=[{"id": "lab/python-code", "args": {"num_tests": 2, "timeout_s": 5.0}}],
    )
    spec.update(changes)
    return spec
