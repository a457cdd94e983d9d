"""Jobs of both kinds through the jobs API and Prime's training routes: the Job object says its
``kind``, ``GET /jobs`` lists training jobs unless ``kind`` asks for the jobs of evaluations,
Prime's runs are training jobs only, and an evaluation's job is restarted and deleted only as its
evaluation (a 400 naming the evaluation's own route, nothing changed)."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation
from jobs.models import Job, JobKind, JobStatus
from jobs.services import job_transition
from lab.models import AuditLogEntry
from tests.support.evaluations import create_evaluation
from tests.support.jobs_helpers import submit
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


@pytest.fixture
def jobs(owner, spec) -> tuple[Job, Evaluation]:
    """A training job, then an evaluation (whose job is newer), both failed."""
    training = submit(owner, spec, name="trained")
    evaluation = create_evaluation(owner)
    for job in (training, evaluation.job):
        job_transition(job=job, to=JobStatus.FAILED, error_message="stopped")
    return training, evaluation


def test_the_job_object_says_its_kind(owner, jobs):
    training, evaluation = jobs
    client = owner.client()

    trained = client.get(f"/api/v1/jobs/{training.public_id}").json()
    evaluating = client.get(f"/api/v1/jobs/{evaluation.job.public_id}").json()

    assert (trained["kind"], evaluating["kind"]) == ("training", "evaluation")
    assert evaluating["metadata"] == {"evaluation": evaluation.public_id}
    assert_matches(served_document(), "Job", evaluating)


def test_the_jobs_list_holds_training_jobs_unless_kind_asks_for_evaluations(owner, jobs):
    training, evaluation = jobs
    client = owner.client()

    default = client.get("/api/v1/jobs").json()
    explicit = client.get("/api/v1/jobs?kind=training").json()
    evaluations = client.get("/api/v1/jobs?kind=evaluation&status=failed").json()
    unknown = client.get("/api/v1/jobs?kind=everything")

    assert [job["id"] for job in default["data"]] == [job["id"] for job in explicit["data"]] == [training.public_id]
    assert [(job["id"], job["kind"]) for job in evaluations["data"]] == [(evaluation.job.public_id, "evaluation")]
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "kind"
    assert "training, evaluation" in unknown.json()["error"]["message"]


def test_restarting_an_evaluations_job_is_refused_naming_the_evaluations_retry(owner, jobs):
    _, evaluation = jobs
    before = AuditLogEntry.objects.count()

    response = owner.client().post(f"/api/v1/jobs/{evaluation.job.public_id}/restart")

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "job_id")
    assert error["message"] == (
        f"{evaluation.job.public_id} is the job of evaluation {evaluation.public_id}; retry the evaluation instead: "
        f"POST /api/v1/evaluations/{evaluation.public_id}/retry (`lab evals retry {evaluation.public_id}`)."
    )
    evaluation.job.refresh_from_db()
    assert evaluation.job.status == JobStatus.FAILED
    assert AuditLogEntry.objects.count() == before
    retried = owner.client().post(f"/api/v1/evaluations/{evaluation.public_id}/retry")
    assert (retried.status_code, retried.json()["status"]) == (200, "queued")


def test_deleting_an_evaluations_job_is_refused_naming_the_evaluations_delete(owner, jobs):
    _, evaluation = jobs

    response = owner.client().delete(f"/api/v1/jobs/{evaluation.job.public_id}")

    assert response.status_code == 400
    assert response.json()["error"]["message"].endswith(
        f"delete the evaluation instead: DELETE /api/v1/evaluations/{evaluation.public_id} "
        f"(`lab evals delete {evaluation.public_id}`)."
    )
    assert Evaluation.objects.unscoped().filter(pk=evaluation.pk).exists()
    assert owner.client().delete(f"/api/v1/evaluations/{evaluation.public_id}").status_code == 204
    assert not Job.objects.unscoped().filter(pk=evaluation.job_id).exists()


def test_a_training_job_still_restarts_and_an_outsiders_evaluation_job_is_a_404(owner, outsider, jobs):
    training, _ = jobs
    theirs = create_evaluation(outsider)

    restarted = owner.client().post(f"/api/v1/jobs/{training.public_id}/restart")
    foreign = [
        owner.client().post(f"/api/v1/jobs/{theirs.job.public_id}/restart"),
        owner.client().delete(f"/api/v1/jobs/{theirs.job.public_id}"),
        owner.client().get("/api/v1/jobs?kind=evaluation"),
    ]

    assert (restarted.status_code, restarted.json()["status"], restarted.json()["kind"]) == (200, "queued", "training")
    assert [response.status_code for response in foreign[:2]] == [404, 404]
    assert theirs.job.public_id not in foreign[2].content.decode()
    assert Job.objects.unscoped().get(pk=theirs.job_id).status == JobStatus.QUEUED


def test_prime_training_routes_see_training_jobs_only(owner, jobs):
    training, evaluation = jobs
    client = owner.client()

    listed = client.get("/prime/api/v1/rft/runs").json()
    reads = [client.get(f"/prime/api/v1/rft/runs/{evaluation.job.public_id}{suffix}") for suffix in ("", "/logs")]
    changes = [
        client.put(f"/prime/api/v1/rft/runs/{evaluation.job.public_id}/restart"),
        client.delete(f"/prime/api/v1/rft/runs/{evaluation.job.public_id}"),
    ]

    assert [run["id"] for run in listed["runs"]] == [training.public_id]
    assert listed["total"] == 1
    assert [(response.status_code, response.json()) for response in reads + changes] == [
        (404, {"detail": "No such run."})
    ] * 4
    assert Job.objects.unscoped().get(pk=evaluation.job_id).kind == JobKind.EVALUATION
    assert Job.objects.unscoped().get(pk=evaluation.job_id).status == JobStatus.FAILED
