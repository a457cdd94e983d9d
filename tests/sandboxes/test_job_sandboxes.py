"""The sandboxes of a job's attempt (docs/sandboxes.md "Sandboxes of a job"): created and deleted
through the ingest API with the job token, the job's and tagged with it, within the
organization's cap, refused once the attempt has ended, and deleted by Lab when it ends."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from engine.sandboxes import Sandbox as DataPlane
from jobs.ingest.tokens import job_token
from jobs.models import AttemptState, JobAttempt
from jobs.sandboxes import sandbox_end_of_ended_attempts
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from lab.models import AuditLogEntry
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from sandboxes.services import sandbox_end_for_attempt, sandbox_spec
from tests.support.dashboard import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("runtime", "no_broker")]


@pytest.fixture(autouse=True)
def _stop_what_the_test_left(runtime):
    """The session's agent outlives each test's rows: stop the sandboxes a test left running."""
    yield
    for sandbox in Sandbox.objects.unscoped().filter(status__in=ACTIVE_STATUSES):
        runtime.destroy(sandbox_spec(sandbox))


def _launched(owner, spec) -> tuple[JobAttempt, APIClient, str]:
    """A job whose attempt 1 is launched, the job token's client, and its ingest ``sandboxes`` URL."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.LAUNCHED)
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt.pk)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return attempt, client, f"/api/v1/ingest/jobs/{job.public_id}/sandboxes"


def _create(client, url, **body) -> dict:
    answer = client.post(url, {"memory_gb": 0.5, **body}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def test_an_attempt_creates_a_sandbox_of_its_job_runs_commands_in_it_and_deletes_it(owner, spec, runtime):
    attempt, client, url = _launched(owner, spec)
    job_id = attempt.job.public_id
    body = _create(client, url, labels={"team": "code"})
    assert body["status"] == "running"
    assert body["job_id"] == job_id
    assert body["labels"] == {"team": "code", "lab.job": job_id, "lab.attempt": "1"}
    assert DataPlane(body["id"], body["data_plane"]["url"], body["data_plane"]["token"]).run("echo ran").stdout == "ran\n"
    row = Sandbox.objects.unscoped().get(public_id=body["id"])
    assert (row.attempt_id, row.project_id, row.created_by_id) == (attempt.pk, owner.project.pk, owner.user.pk)
    audit = AuditLogEntry.objects.get(action="sandbox.create", target=body["id"])
    assert audit.data == {"image": "python:3.11", "network": "none", "job": job_id, "attempt": 1}
    listed = owner.client().get("/api/v1/sandboxes", {"label[lab.job]": job_id}).json()["data"]
    assert [(item["id"], item["job_id"]) for item in listed] == [(body["id"], job_id)]
    assert client.delete(f"{url}/{body['id']}").status_code == 204
    assert client.delete(f"{url}/{body['id']}").status_code == 204  # idempotent
    row.refresh_from_db()
    assert row.status == SandboxStatus.STOPPED
    assert body["id"] not in runtime.held()[1]


def test_a_sandbox_the_attempt_did_not_make_is_a_404_to_it(owner, spec):
    attempt, client, url = _launched(owner, spec)
    other, other_client, other_url = _launched(owner, spec)
    theirs = _create(other_client, other_url)["id"]
    users = owner.client().post("/api/v1/sandboxes", {"memory_gb": 0.5}, format="json").json()["id"]
    for sandbox_id in (theirs, users, "sbx_missing"):
        answer = client.delete(f"{url}/{sandbox_id}")
        assert answer.status_code == 404, sandbox_id
        assert answer.json()["error"]["code"] == "not_found"
    assert set(Sandbox.objects.unscoped().filter(public_id__in=[theirs, users]).values_list("status", flat=True)) == {"running"}


def test_an_ended_attempt_creates_none_and_lab_ends_those_it_made(owner, spec, runtime):
    attempt, client, url = _launched(owner, spec)
    made = [_create(client, url)["id"] for _ in range(2)]
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED)
    refused = client.post(url, {"memory_gb": 0.5}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_state"
    assert Sandbox.objects.unscoped().filter(attempt=attempt).count() == 2
    assert sandbox_end_for_attempt(attempt_id=attempt.pk) == 2
    assert sandbox_end_for_attempt(attempt_id=attempt.pk) == 0
    assert set(Sandbox.objects.unscoped().filter(attempt=attempt).values_list("status", flat=True)) == {"stopped"}
    assert not set(made) & runtime.held()[1]
    deleted = AuditLogEntry.objects.filter(action="sandbox.delete", target__in=made)
    assert deleted.count() == 2 and {entry.actor_user_id for entry in deleted} == {None}


def test_the_job_reconciler_ends_the_sandboxes_of_ended_attempts_and_no_others(owner, spec, runtime):
    attempt, client, url = _launched(owner, spec)
    live_attempt, live_client, live_url = _launched(owner, spec)
    ended, live = _create(client, url)["id"], _create(live_client, live_url)["id"]
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED)
    assert sandbox_end_of_ended_attempts() == 1
    statuses = dict(Sandbox.objects.unscoped().values_list("public_id", "status"))
    assert statuses == {ended: "stopped", live: "running"}
    assert ended not in runtime.held()[1] and live in runtime.held()[1]


def test_an_attempts_sandboxes_count_against_the_organizations_cap(owner, spec, settings):
    settings.LAB_SANDBOX_MAX_PER_ORG = 1
    attempt, client, url = _launched(owner, spec)
    _create(client, url)
    refused = client.post(url, {"memory_gb": 0.5}, format="json")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert owner.client().post("/api/v1/sandboxes", {}, format="json").status_code == 429
    assert Sandbox.objects.unscoped().count() == 1


def test_the_job_page_counts_the_sandboxes_its_attempts_made_and_their_seconds(owner, spec):
    attempt, client, url = _launched(owner, spec)
    job = attempt.job
    page = f"/o/{owner.organization.slug}/p/{owner.project.slug}/jobs/{job.public_id}/"
    assert 'id="job-sandboxes"' not in signed_in(owner.user).get(page).content.decode()  # none made: no line
    done, running = _create(client, url)["id"], _create(client, url)["id"]
    assert client.delete(f"{url}/{done}").status_code == 204
    start = timezone.now() - timedelta(seconds=100)
    Sandbox.objects.unscoped().filter(public_id=done).update(started_at=start, stopped_at=start + timedelta(seconds=30))
    Sandbox.objects.unscoped().filter(public_id=running).update(started_at=timezone.now() - timedelta(seconds=60))
    html = signed_in(owner.user).get(page).content.decode()
    line = re.search(r'<dd id="job-sandboxes">([^<]*)</dd>', html).group(1)
    made, active, seconds = re.fullmatch(r"(\d+) made · (\d+) active · (\d+) sandbox-s", line).groups()
    assert (made, active) == ("2", "1") and 90 <= int(seconds) <= 100  # 30 s stopped, about 60 s running


def test_the_jobs_metrics_count_its_sandboxes_on_the_newest_step_each_report_brings(owner, spec):
    attempt, client, url = _launched(owner, spec)
    job = attempt.job
    metrics_url = f"/api/v1/ingest/jobs/{job.public_id}/metrics"

    def report(*steps: int) -> None:
        points = [{"step": step, "time": timezone.now().isoformat(), "values": {"loss/mean": 1.0}} for step in steps]
        answer = client.post(metrics_url, {"attempt": 1, "points": points}, format="json")
        assert answer.status_code == 200, answer.content

    def values(step: int) -> dict:
        [point] = owner.client().get(f"/api/v1/jobs/{job.public_id}/metrics", {"after_step": step - 1, "limit": 1}).json()["data"]
        assert point["step"] == step
        return point["values"]

    report(1)
    assert not {name for name in values(1) if name.startswith("sandboxes/")}  # none made: no series
    done, running = _create(client, url)["id"], _create(client, url)["id"]
    assert client.delete(f"{url}/{done}").status_code == 204
    start = timezone.now() - timedelta(seconds=100)
    Sandbox.objects.unscoped().filter(public_id=done).update(started_at=start, stopped_at=start + timedelta(seconds=30))
    Sandbox.objects.unscoped().filter(public_id=running).update(started_at=timezone.now() - timedelta(seconds=60))
    report(2, 3)
    assert "sandboxes/made" not in values(2)  # an older step of the report: its counts were not read then
    third = values(3)
    assert (third["sandboxes/made"], third["sandboxes/active"], third["loss/mean"]) == (2.0, 1.0, 1.0)
    assert 90 <= third["sandboxes/seconds"] <= 100  # 30 s stopped, about 60 s running
