"""A job that failed in a way its spec would fail again (``invalid_spec``, or ``environment_error``
before it trained) is not restarted: the API answers 409 ``invalid_state`` saying to edit and
resubmit, and the job page offers "Edit and resubmit" (the new-job form with its spec) instead of
Restart. One that failed after it trained restarts as before."""

from __future__ import annotations

import tomllib

import pytest

from jobs.models import ErrorCode, Job, JobStatus
from jobs.services import job_transition
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

PROJECT = "/o/acme/p/default/"


def failed_job(tenant, spec, code: str, *, trained: bool = False) -> Job:
    job = submit(tenant, spec, name="adder")
    engine = Engine(job)
    if trained:
        engine.running(step=3)
    job.refresh_from_db()
    return job_transition(job=job, to=JobStatus.FAILED, error_code=code, error_message="takes no argument 'max_digit'")


@pytest.mark.parametrize("code", [ErrorCode.INVALID_SPEC, ErrorCode.ENVIRONMENT_ERROR])
def test_restart_of_a_job_that_would_fail_again_is_a_409_saying_to_edit_and_resubmit(owner, spec, code):
    job = failed_job(owner, spec, code)

    response = owner.client().post(f"/api/v1/jobs/{job.public_id}/restart")

    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_state"
    assert f"failed with {code} before it trained" in error["message"]
    assert "edit the spec and submit it as a new job" in error["message"]
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.FAILED


def test_an_environment_error_after_training_began_restarts(owner, spec):
    job = failed_job(owner, spec, ErrorCode.ENVIRONMENT_ERROR, trained=True)
    assert job.started_at is not None and not job.fails_again

    response = owner.client().post(f"/api/v1/jobs/{job.public_id}/restart")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued"


def test_the_job_page_offers_edit_and_resubmit_instead_of_restart(owner, owner_client, spec):
    job = failed_job(owner, spec, ErrorCode.INVALID_SPEC)

    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()

    assert "Edit and resubmit" in page and f"jobs/new/?from_job={job.public_id}" in page
    assert f"jobs/{job.public_id}/restart/" not in page
    refused = owner_client.post(f"{PROJECT}jobs/{job.public_id}/restart/", follow=True)
    assert "submit it as a new job" in refused.content.decode()
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.FAILED


def test_a_job_that_can_succeed_again_keeps_restart(owner, owner_client, spec):
    job = failed_job(owner, spec, ErrorCode.OOM)

    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()

    assert f"jobs/{job.public_id}/restart/" in page and "Edit and resubmit" not in page


def test_edit_and_resubmit_prefills_the_form_with_the_jobs_spec_and_its_error(owner, owner_client, spec):
    job = failed_job(owner, spec, ErrorCode.INVALID_SPEC)

    response = owner_client.get(f"{PROJECT}jobs/new/?from_job={job.public_id}")

    assert response.status_code == 200
    text = response.context["form"].initial["spec"]
    assert text.startswith(f"# A new job from the spec of {job.public_id}.\n# It failed with invalid_spec: takes no argument")
    assert tomllib.loads(text) == {key: value for key, value in job.spec.items() if value is not None}


def test_edit_and_resubmit_of_another_tenants_job_is_a_404(owner, outsider, owner_client, spec):
    job = failed_job(outsider, spec, ErrorCode.INVALID_SPEC)

    assert owner_client.get(f"{PROJECT}jobs/new/?from_job={job.public_id}").status_code == 404
