"""A job attempt's sandbox key (docs/sandboxes.md "Sandboxes of a job"): what the engine hands its
environments as ``PRIME_API_KEY``, with ``PRIME_API_BASE_URL`` at Lab's ``/prime``. Prime's own
``prime-sandboxes`` 0.5.1 (in this process, against a live Lab and the session's real agent)
creates, runs and deletes sandboxes of that attempt with it; it reaches no other sandbox of the
organization and no other route; it stops working when the attempt ends, and Lab deletes what
the attempt made."""

from __future__ import annotations

import pytest
from prime_sandboxes import APIClient as PrimeAPIClient
from prime_sandboxes import APIError, CreateSandboxRequest, SandboxClient, UnauthorizedError
from rest_framework.test import APIClient

from jobs.models import AttemptState, JobAttempt
from lab.models import AuditLogEntry
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.services import sandbox_end_for_attempt
from tests.support.job_sandboxes import attempt_sandbox_key, launched_attempt, stop_active_sandboxes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime", "no_broker")]


@pytest.fixture(autouse=True)
def _stop_what_the_test_left(runtime):
    """The session's agent outlives each test's rows: stop the sandboxes a test left running."""
    yield
    stop_active_sandboxes(runtime)


@pytest.fixture
def prime(live_server, tmp_path, monkeypatch):
    """Return ``make(key)``: a SandboxClient of the SDK for ``key`` at the live Lab's ``/prime``."""
    monkeypatch.setenv("HOME", str(tmp_path))  # its config and auth cache live under ~/.prime
    monkeypatch.setenv("PRIME_API_BASE_URL", f"{live_server.url}/prime")
    monkeypatch.setenv("PRIME_DISABLE_VERSION_CHECK", "1")
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)

    def make(key: str) -> SandboxClient:
        client = SandboxClient(PrimeAPIClient(api_key=key))
        client.clear_auth_cache()
        return client

    return make


def test_the_engine_gets_its_attempts_key_and_prime_sandboxes_runs_sandboxes_of_the_job_with_it(
    owner, spec, prime, runtime, settings
):
    attempt, engine = launched_attempt(owner, spec)
    handed = attempt_sandbox_key(attempt, engine)
    client = prime(handed["api_key"])

    sandbox = client.create(CreateSandboxRequest(name="grader", docker_image="python:3.11", timeout_minutes=10))
    client.wait_for_creation(sandbox.id)
    ran = client.execute_command(sandbox.id, "echo $((6 * 7))")
    listed = client.list()
    got = client.get(sandbox.id)
    client.delete(sandbox.id)

    job_id = attempt.job.public_id
    assert handed == {
        "api_key": handed["api_key"],
        "base_url": f"{settings.LAB_PUBLIC_URL}/prime",
        "data_plane_url": settings.LAB_SANDBOX_DATA_PLANE_URL,
    }
    assert handed["api_key"].startswith("lsk_") and handed == attempt_sandbox_key(attempt, engine)  # one key per attempt
    assert (sandbox.status, ran.stdout, ran.exit_code) == ("RUNNING", "42\n", 0)
    assert [item.id for item in listed.sandboxes] == [sandbox.id] and got.status == "RUNNING"
    row = Sandbox.objects.unscoped().get(public_id=sandbox.id)
    assert (row.attempt_id, row.project_id, row.created_by_id, row.status) == (
        attempt.pk,
        owner.project.pk,
        owner.user.pk,
        SandboxStatus.STOPPED,
    )
    assert row.labels == {"lab.job": job_id, "lab.attempt": "1"}
    assert AuditLogEntry.objects.get(action="sandbox.create", target=sandbox.id).data == {
        "image": "python:3.11",
        "network": "none",
        "job": job_id,
        "attempt": 1,
    }
    assert sandbox.id not in runtime.held()[1]


def test_the_key_reaches_no_other_sandbox_of_the_organization_and_no_other_route(owner, spec, prime, live_server):
    attempt, engine = launched_attempt(owner, spec)
    key = attempt_sandbox_key(attempt, engine)["api_key"]
    other_attempt, other_engine = launched_attempt(owner, spec)
    users = prime(owner.key).create(CreateSandboxRequest(name="users", docker_image="python:3.11"))
    theirs = prime(attempt_sandbox_key(other_attempt, other_engine)["api_key"]).create(
        CreateSandboxRequest(name="theirs", docker_image="python:3.11")
    )
    client = prime(key)
    mine = client.create(CreateSandboxRequest(name="mine", docker_image="python:3.11"))

    assert [item.id for item in client.list().sandboxes] == [mine.id]
    for sandbox_id in (users.id, theirs.id):
        for call in (
            lambda: client.get(sandbox_id),
            lambda: client.delete(sandbox_id),
            lambda: client.execute_command(sandbox_id, "touch /workspace/pwned"),
            lambda: client.get_logs(sandbox_id),
        ):
            with pytest.raises(APIError) as refused:
                call()
            assert "HTTP 404" in str(refused.value)
    client.execute_command(mine.id, "echo mine")
    assert client.get_logs(mine.id) == "mine\n"
    assert client.bulk_delete(sandbox_ids=[users.id, theirs.id]).succeeded == []
    assert client.bulk_delete(labels=[f"lab.job={other_attempt.job.public_id}"]).succeeded == []
    assert set(
        Sandbox.objects.unscoped().filter(public_id__in=[users.id, theirs.id]).values_list("status", flat=True)
    ) == {"running"}

    as_key = APIClient()
    as_key.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    refused = {
        ("GET", "/api/v1/whoami"): as_key.get("/api/v1/whoami"),
        ("GET", "/api/v1/sandboxes"): as_key.get("/api/v1/sandboxes"),
        ("POST", "/api/v1/sandboxes"): as_key.post("/api/v1/sandboxes", {}, format="json"),
        ("GET", "/api/v1/jobs"): as_key.get("/api/v1/jobs"),
        ("POST", "/api/v1/jobs"): as_key.post("/api/v1/jobs", spec, format="json"),
        ("GET", "/prime/api/v1/rft/runs"): as_key.get("/prime/api/v1/rft/runs"),
        ("POST", "ingest status"): as_key.post(
            f"/api/v1/ingest/jobs/{attempt.job.public_id}/status",
            {"attempt": 1, "phase": "running", "step": 0},
            format="json",
        ),
        ("POST", "ingest sandboxes"): as_key.post(
            f"/api/v1/ingest/jobs/{attempt.job.public_id}/sandboxes", {}, format="json"
        ),
    }
    assert {route: answer.status_code for route, answer in refused.items()} == {route: 401 for route in refused}
    assert Sandbox.objects.unscoped().filter(attempt=attempt).count() == 1
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION=f"Bearer {key[:-3]}xyz")
    assert forged.get("/prime/api/v1/sandbox").status_code == 401


def test_the_key_stops_working_when_its_attempt_ends_and_lab_deletes_what_it_made(owner, spec, prime, runtime):
    attempt, engine = launched_attempt(owner, spec)
    client = prime(attempt_sandbox_key(attempt, engine)["api_key"])
    made = client.create(CreateSandboxRequest(name="grader", docker_image="python:3.11"))
    assert made.id in runtime.held()[1]

    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED)
    assert sandbox_end_for_attempt(attempt_id=attempt.pk) == 1  # what the pipeline does when it closes the attempt

    for call in (
        lambda: client.list(),
        lambda: client.create(CreateSandboxRequest(name="late", docker_image="python:3.11")),
    ):
        with pytest.raises(UnauthorizedError):
            call()
    late = engine.post(f"/api/v1/ingest/jobs/{attempt.job.public_id}/sandbox-key", {}, format="json")
    assert (late.status_code, late.json()["error"]["code"]) == (409, "invalid_state")
    assert list(Sandbox.objects.unscoped().filter(attempt=attempt).values_list("status", flat=True)) == [
        SandboxStatus.STOPPED
    ]
    assert made.id not in runtime.held()[1]
