"""The real SDK (labsdk) against the real jobs API on a live HTTP server (docs/api.md).

Tenants are made through ``lab.services``; everything else goes over HTTP exactly as a user's
program would: create in its three forms, retrieve, list with paging and filters, cancel,
events, estimate, the catalogues, typed errors, and a create whose first answer is lost.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from decimal import Decimal

import labsdk
import pytest
from labsdk import (
    AuthenticationError,
    ConflictError,
    InvalidSpecError,
    Lab,
    NotFoundError,
    PermissionDeniedError,
    RequestTooLargeError,
)

from jobs.models import Job, JobEvent, JobStatus
from jobs.services import job_transition
from lab.audit import Actor
from lab.models import IdempotencyRecord
from lab.services import api_key_revoke

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
#: The Job keys of docs/api.md "Objects".
JOB_KEYS = {
    "id", "object", "name", "status", "status_reason", "queue_position", "spec", "warnings", "attempt", "step",
    "max_steps", "created_at", "started_at", "finished_at", "error", "usage", "latest_checkpoint", "metadata",
}


def test_it_creates_a_job_from_a_spec_file(lab, tenant, tiny_toml):
    job = lab.jobs.create(spec_file=str(tiny_toml))

    stored = Job.objects.unscoped().get(project=tenant.project)
    assert job.id == stored.public_id
    assert job.id.startswith("job_")
    assert (job.status, job.status_reason, job.queue_position) == ("queued", "waiting", 1)
    assert job.object == "job"
    assert job.spec["model"] == "lab/tiny-random-llama"
    assert job.spec["env"][0]["id"] == "lab/addition"
    assert job.created_at is not None and job.created_at.utcoffset().total_seconds() == 0
    assert job.started_at is None and job.finished_at is None and job.error is None
    assert job.usage.cost_usd == Decimal("0.00")
    assert JobEvent.objects.filter(job=stored).values_list("type", flat=True).get() == "job.queued"


def test_the_job_body_has_every_key_of_the_contract(live_server, tenant, spec):
    import httpx

    response = httpx.post(
        f"{live_server.url}/api/v1/jobs", json=spec, headers={"Authorization": f"Bearer {tenant.key}"}
    )

    assert response.status_code == 201
    body = response.json()
    assert JOB_KEYS <= set(body), JOB_KEYS - set(body)
    assert ISO_UTC.match(body["created_at"])
    assert body["usage"] == {"gpu_seconds": 0.0, "cpu_seconds": 0.0, "cost_usd": "0.00"}


def test_it_creates_from_a_dict_and_from_keyword_fields(lab, tenant, spec):
    from_dict = lab.jobs.create(spec=spec)
    from_fields = lab.jobs.create(**{**spec, "name": "from-fields"})
    overridden = lab.jobs.create(spec, name="renamed", max_steps=5)

    assert from_dict.name == "addition-tiny"
    assert from_fields.name == "from-fields"
    assert (overridden.name, overridden.max_steps, overridden.spec["max_steps"]) == ("renamed", 5, 5)
    assert Job.objects.unscoped().filter(project=tenant.project).count() == 3


def test_it_stores_prime_keys_and_warns_about_them(lab, spec):
    job = lab.jobs.create(spec, oversampling_factor=1.5, wandb={"project": "x"})

    assert len(job.warnings) == 2
    assert any("'oversampling_factor': the engine samples whole batches ahead" in warning for warning in job.warnings)
    assert any("wandb" in warning for warning in job.warnings)
    assert job.spec["wandb"] == {"project": "x"}
    assert lab.jobs.retrieve(job.id).warnings == job.warnings


def test_it_retrieves_a_job(lab, spec):
    created = lab.jobs.create(spec)

    fetched = lab.jobs.retrieve(created.id)

    assert fetched.to_dict() == created.to_dict()


def test_it_lists_every_job_across_pages_newest_first(lab, tenant, spec):
    ids = [lab.jobs.create(spec, name=f"run-{index}").id for index in range(5)]

    listed = [job.id for job in lab.jobs.list(limit=2)]

    assert listed == ids[::-1]


def test_it_filters_the_list_by_metadata_and_status(lab, spec):
    research = [lab.jobs.create(spec, metadata={"team": "research", "n": str(i)}).id for i in range(3)]
    lab.jobs.create(spec, metadata={"team": "infra"})
    lab.jobs.cancel(research[0])

    assert [job.id for job in lab.jobs.list(metadata={"team": "research"}, limit=1)] == research[::-1]
    assert [job.id for job in lab.jobs.list(metadata={"team": "research", "n": "1"})] == [research[1]]
    assert [job.id for job in lab.jobs.list(metadata={"team": "nobody"})] == []
    assert [job.id for job in lab.jobs.list(status="cancelled")] == [research[0]]


def test_it_cancels_a_queued_job_at_once_and_records_events(lab, tenant, spec):
    created = lab.jobs.create(spec)

    cancelled = lab.jobs.cancel(created.id)

    assert (cancelled.status, cancelled.status_reason, cancelled.queue_position) == ("cancelled", None, None)
    assert cancelled.finished_at is not None
    assert Job.objects.unscoped().get(public_id=created.id).status == JobStatus.CANCELLED
    events = list(lab.jobs.events(created.id, limit=1))
    assert [event.type for event in events] == ["job.queued", "job.cancelled"]
    assert all(event.id.startswith("evt_") and event.level == "info" for event in events)
    assert events[1].data == {"from": "queued", "to": "cancelled"}


def test_cancelling_a_cancelled_job_is_a_conflict(lab, spec):
    job = lab.jobs.create(spec)
    lab.jobs.cancel(job.id)

    with pytest.raises(ConflictError) as caught:
        lab.jobs.cancel(job.id)

    assert (caught.value.status_code, caught.value.code) == (409, "invalid_state")
    assert [event.type for event in lab.jobs.events(job.id)] == ["job.queued", "job.cancelled"]


def test_cancelling_a_running_job_answers_cancelling_and_again_is_a_no_op(lab, spec):
    job = lab.jobs.create(spec)
    stored = Job.objects.unscoped().get(public_id=job.id)
    job_transition(job=stored, to=JobStatus.STARTING)
    job_transition(job=stored, to=JobStatus.RUNNING)

    first = lab.jobs.cancel(job.id)
    second = lab.jobs.cancel(job.id)

    assert (first.status, second.status) == ("cancelling", "cancelling")
    assert first.started_at is not None and first.finished_at is None
    assert [event.type for event in lab.jobs.events(job.id)] == [
        "job.queued", "job.starting", "job.started", "job.cancelling"
    ]


def test_list_pages_end_exactly_and_take_only_this_projects_cursors(live_server, lab, outsider, spec):
    import httpx

    ids = [lab.jobs.create(spec).id for _ in range(2)]
    own = {"Authorization": f"Bearer {lab.api_key}"}
    foreign = {"Authorization": f"Bearer {outsider.key}"}

    full_page = httpx.get(f"{live_server.url}/api/v1/jobs", params={"limit": 2}, headers=own).json()
    after_last = httpx.get(f"{live_server.url}/api/v1/jobs", params={"after": ids[0]}, headers=own).json()
    foreign_cursor = httpx.get(f"{live_server.url}/api/v1/jobs", params={"after": ids[1]}, headers=foreign)
    too_many = httpx.get(f"{live_server.url}/api/v1/jobs", params={"limit": 101}, headers=own)

    assert ([job["id"] for job in full_page["data"]], full_page["has_more"]) == (ids[::-1], False)
    assert after_last == {"object": "list", "data": [], "has_more": False}
    assert foreign_cursor.status_code == 404
    assert foreign_cursor.json()["error"]["code"] == "not_found"
    assert (too_many.status_code, too_many.json()["error"]["param"]) == (400, "limit")


def test_it_estimates_without_creating_anything(lab, tenant, spec):
    estimate = lab.jobs.estimate(spec, wandb={"project": "x"})

    assert estimate.cpu_seconds > 0 and estimate.gpu_seconds == 0
    assert isinstance(estimate.cost_usd, Decimal) and estimate.cost_usd >= 0
    assert estimate.queue_position == 1
    assert isinstance(estimate.can_start_now, bool)
    assert len(estimate.warnings) == 1 and "wandb" in estimate.warnings[0]
    assert not Job.objects.unscoped().exists()


def test_it_reads_the_catalogues_prices_and_whoami(lab, tenant):
    models = {model.id: model for model in lab.models.list()}
    environments = {environment.id: environment for environment in lab.environments.list()}
    prices = {price.resource_type: price for price in lab.prices.list()}
    identity = lab.whoami()

    assert models["lab/tiny-random-llama"].context_length == 512
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in models
    assert environments["lab/addition"].args["max_operand"] == 20
    assert prices["cpu"].usd_per_hour == Decimal("0.10")
    assert prices["H100"].usd_per_hour == Decimal("2.50")
    assert (identity.organization.slug, identity.project.slug) == ("acme", "default")
    assert identity.organization.id == tenant.organization.public_id
    assert identity.scopes == ["read", "write"]


def test_the_module_level_client_reads_the_environment(live_server, tenant, spec, monkeypatch):
    monkeypatch.setenv("LAB_API_KEY", tenant.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    monkeypatch.setattr("labsdk._default._client", None)

    job = labsdk.jobs.create(spec)

    assert labsdk.jobs.retrieve(job.id).id == job.id
    assert labsdk.whoami().project.slug == "default"
    labsdk.default_client().close()


def test_a_bad_spec_is_an_invalid_spec_error_naming_every_field(lab, tenant, spec):
    spec["batch_size"] = 30
    spec["sampling"]["temperature"] = 3.0
    spec["env"] = [{"id": "primeintellect/reverse-text"}]
    spec["colour"] = "blue"

    with pytest.raises(InvalidSpecError) as caught:
        lab.jobs.create(spec)

    error = caught.value
    assert (error.status_code, error.code) == (400, "invalid_spec")
    params = {problem.param for problem in error.errors}
    assert {"colour", "sampling.temperature", "env.0.id"} <= params
    assert any(param in params for param in ("batch_size", "rollouts_per_example"))
    assert error.param == error.errors[0].param
    unknown_env = next(problem for problem in error.errors if problem.param == "env.0.id")
    assert "lab/addition" in unknown_env.message
    assert not Job.objects.unscoped().exists()


def test_estimate_reports_the_same_problems_as_create(lab, spec):
    spec["env"] = [{"id": "primeintellect/reverse-text"}]

    with pytest.raises(InvalidSpecError) as on_estimate:
        lab.jobs.estimate(spec)
    with pytest.raises(InvalidSpecError) as on_create:
        lab.jobs.create(spec)

    assert on_estimate.value.errors == on_create.value.errors
    assert on_estimate.value.param == "env.0.id"


def test_a_wrong_key_is_an_authentication_error(live_server, tenant):
    with Lab(api_key="lab_not-a-real-key", base_url=live_server.url, max_retries=0) as client:
        with pytest.raises(AuthenticationError) as caught:
            client.jobs.list().__next__()

    assert (caught.value.status_code, caught.value.code) == (401, "invalid_api_key")
    assert "API key" in caught.value.message


def test_a_revoked_key_is_an_authentication_error(live_server, tenant):
    api_key_revoke(actor=Actor(user=tenant.user), api_key=tenant.api_key)

    with Lab(api_key=tenant.key, base_url=live_server.url, max_retries=0) as client:
        with pytest.raises(AuthenticationError) as caught:
            client.whoami()

    assert (caught.value.status_code, caught.value.code) == (401, "invalid_api_key")


def test_a_read_only_key_reads_and_estimates_but_cannot_create_or_cancel(live_server, lab, read_key, spec):
    job = lab.jobs.create(spec)
    with Lab(api_key=read_key, base_url=live_server.url, max_retries=0) as reader:
        with pytest.raises(PermissionDeniedError) as on_create:
            reader.jobs.create(spec)
        with pytest.raises(PermissionDeniedError) as on_cancel:
            reader.jobs.cancel(job.id)
        assert [listed.id for listed in reader.jobs.list()] == [job.id]
        assert reader.jobs.estimate(spec).queue_position == 2
        assert reader.whoami().scopes == ["read"]

    assert (on_create.value.status_code, on_create.value.code) == (403, "insufficient_scope")
    assert on_cancel.value.code == "insufficient_scope"
    assert Job.objects.unscoped().count() == 1
    assert Job.objects.unscoped().get().status == JobStatus.QUEUED


def test_another_tenants_job_is_not_found_and_unchanged(live_server, lab, outsider, spec):
    job = lab.jobs.create(spec)
    with Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0) as other:
        for call in (other.jobs.retrieve, other.jobs.cancel, lambda job_id: list(other.jobs.events(job_id))):
            with pytest.raises(NotFoundError) as caught:
                call(job.id)
            assert (caught.value.status_code, caught.value.code) == (404, "not_found")
        assert list(other.jobs.list()) == []
        with pytest.raises(NotFoundError) as missing:
            other.jobs.retrieve("job_doesnotexist0000000")

    assert missing.value.message == caught.value.message
    stored = Job.objects.unscoped().get()
    assert stored.status == JobStatus.QUEUED
    assert JobEvent.objects.filter(job=stored).count() == 1


def test_an_idempotency_key_replays_and_refuses_another_body(lab, tenant, spec):
    first = lab.jobs.create(spec, idempotency_key="nightly-1")
    replayed = lab.jobs.create(spec, idempotency_key="nightly-1")

    with pytest.raises(ConflictError) as caught:
        lab.jobs.create(spec, name="other", idempotency_key="nightly-1")

    assert replayed.id == first.id
    assert (caught.value.status_code, caught.value.code) == (409, "idempotency_conflict")
    assert Job.objects.unscoped().filter(project=tenant.project).count() == 1


def test_a_body_over_one_megabyte_is_request_too_large(lab, spec):
    with pytest.raises(RequestTooLargeError) as caught:
        lab.jobs.create(spec, metadata={"blob": "x" * 1_100_000})

    assert (caught.value.status_code, caught.value.code) == (413, "request_too_large")
    assert not Job.objects.unscoped().exists()


# --- a create whose first answer is lost ------------------------------------------------------


def _read_message(stream) -> bytes | None:
    """Read one HTTP/1.1 request (head and Content-Length body) from a socket file, or None at EOF."""
    head = b""
    while True:
        line = stream.readline()
        if not line:
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            break
    length = 0
    for header in head.split(b"\r\n")[1:]:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head + stream.read(length)


class LosingProxy:
    """A TCP proxy on 127.0.0.1 in front of the live server, one request per connection.

    Each request is forwarded with ``Connection: close`` and the whole answer is read back. For
    the first ``POST /api/v1/jobs`` the answer is then thrown away and the client's connection
    closed, so the server has created the job but the client sees the connection drop.
    """

    def __init__(self, upstream: str):
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.requests: list[bytes] = []
        self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client, client.makefile("rb") as incoming:
            request = _read_message(incoming)
            if request is None:
                return
            self.requests.append(request)
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            forwarded = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
            with socket.create_connection(self.upstream) as server:
                server.sendall(forwarded)
                answer = b""
                while chunk := server.recv(65536):
                    answer += chunk
            if request.startswith(b"POST /api/v1/jobs ") and self.dropped == 0:
                self.dropped += 1
                client.shutdown(socket.SHUT_RDWR)
                return
            client.sendall(answer)

    def close(self) -> None:
        self._listener.close()


def _idempotency_key(request: bytes) -> bytes:
    found = re.search(rb"\r\nIdempotency-Key: *([^\r\n]+)", request, re.IGNORECASE)
    assert found, request[:300]
    return found.group(1)


def test_a_create_whose_answer_is_lost_is_retried_without_a_second_job(live_server, tenant, spec):
    proxy = LosingProxy(live_server.url)
    try:
        with Lab(api_key=tenant.key, base_url=proxy.url, timeout=10, max_retries=2) as client:
            job = client.jobs.create(spec)
            fetched = client.jobs.retrieve(job.id)
    finally:
        proxy.close()

    posts = [request for request in proxy.requests if request.startswith(b"POST /api/v1/jobs ")]
    assert proxy.dropped == 1
    assert len(posts) == 2
    assert _idempotency_key(posts[0]) == _idempotency_key(posts[1])
    assert posts[0].partition(b"\r\n\r\n")[2] == posts[1].partition(b"\r\n\r\n")[2]
    assert Job.objects.unscoped().filter(project=tenant.project).count() == 1
    assert job.id == Job.objects.unscoped().get().public_id == fetched.id
    assert IdempotencyRecord.objects.filter(project=tenant.project).count() == 1


def test_a_lost_answer_without_retries_left_is_a_connection_error_and_one_job(live_server, tenant, spec):
    proxy = LosingProxy(live_server.url)
    try:
        with Lab(api_key=tenant.key, base_url=proxy.url, timeout=10, max_retries=0) as client:
            with pytest.raises(labsdk.APIConnectionError):
                client.jobs.create(spec)
    finally:
        proxy.close()

    assert Job.objects.unscoped().filter(project=tenant.project).count() == 1


def test_concurrent_creates_with_one_idempotency_key_make_one_job(live_server, tenant, spec):
    from concurrent.futures import ThreadPoolExecutor

    def create(_):
        with Lab(api_key=tenant.key, base_url=live_server.url, timeout=30, max_retries=0) as client:
            return client.jobs.create(spec, idempotency_key="same-key-everywhere").id

    with ThreadPoolExecutor(max_workers=6) as pool:
        ids = list(pool.map(create, range(6)))

    assert len(set(ids)) == 1
    assert Job.objects.unscoped().filter(project=tenant.project).count() == 1
    assert ids[0] == Job.objects.unscoped().get().public_id


def test_past_the_rate_limit_the_sdk_raises_rate_limit_error_with_retry_after(live_server, tenant, settings):
    settings.LAB_API_RATE_LIMIT_PER_MINUTE = 3
    if time.time() % 60 > 55:
        time.sleep(60 - time.time() % 60)  # the limit counts per clock minute: stay inside one

    with Lab(api_key=tenant.key, base_url=live_server.url, max_retries=0) as client:
        for _ in range(3):
            client.whoami()
        with pytest.raises(labsdk.RateLimitError) as caught:
            client.whoami()

    assert (caught.value.status_code, caught.value.code) == (429, "rate_limited")
    assert 0 < caught.value.retry_after <= 60


def test_limits_are_checked_at_submit(lab, spec):
    spec["sampling"]["max_tokens"] = 600
    spec["resources"] = {"gpu_type": "H100", "gpus": 1}

    with pytest.raises(InvalidSpecError) as caught:
        lab.jobs.create(spec)

    problems = {problem.param: problem.code for problem in caught.value.errors}
    assert set(problems) == {"sampling.max_tokens", "resources.gpu_type"}, caught.value.errors
    assert "512" in next(p.message for p in caught.value.errors if p.param == "sampling.max_tokens")
    assert not Job.objects.unscoped().exists()


def test_an_unknown_key_is_named_with_the_allowed_ones(lab, spec):
    spec["colour"] = "blue"

    with pytest.raises(InvalidSpecError) as caught:
        lab.jobs.create(spec)

    assert caught.value.param == "colour"
    assert "max_steps" in caught.value.errors[0].message and "rollouts_per_example" in caught.value.errors[0].message


def test_an_idempotency_key_never_replays_another_tenants_answer(live_server, lab, tenant, outsider, spec):
    ours = lab.jobs.create(spec, idempotency_key="shared-key")
    with Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0) as other:
        theirs = other.jobs.create(spec, idempotency_key="shared-key")
        cancelled_elsewhere = other.jobs.cancel(theirs.id)

    assert theirs.id != ours.id
    assert Job.objects.unscoped().get(public_id=theirs.id).project == outsider.project
    assert cancelled_elsewhere.status == "cancelled"
    assert lab.jobs.retrieve(ours.id).status == "queued"


def test_it_restarts_and_deletes_a_cancelled_job(lab, spec):
    job = lab.jobs.create(spec)
    lab.jobs.cancel(job.id)

    restarted = lab.jobs.restart(job.id)
    lab.jobs.cancel(job.id)
    lab.jobs.delete(job.id)

    assert (restarted.id, restarted.status, restarted.status_reason) == (job.id, "queued", "waiting")
    assert restarted.finished_at is None
    with pytest.raises(NotFoundError):
        lab.jobs.retrieve(job.id)
    assert not Job.objects.unscoped().exists()


def test_running_jobs_can_be_neither_restarted_nor_deleted(lab, spec):
    job = lab.jobs.create(spec)

    with pytest.raises(ConflictError) as on_restart:
        lab.jobs.restart(job.id)
    with pytest.raises(ConflictError) as on_delete:
        lab.jobs.delete(job.id)

    assert (on_restart.value.code, on_delete.value.code) == ("invalid_state", "invalid_state")
    assert Job.objects.unscoped().get().status == JobStatus.QUEUED


def test_another_tenant_reaches_none_of_a_jobs_endpoints(live_server, lab, outsider, spec):
    job = lab.jobs.create(spec)
    lab.jobs.cancel(job.id)
    with Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0) as other:
        calls = {
            "restart": lambda: other.jobs.restart(job.id),
            "delete": lambda: other.jobs.delete(job.id),
            "metrics": lambda: list(other.jobs.metrics(job.id)),
            "logs": lambda: list(other.jobs.logs(job.id)),
            "samples": lambda: other.jobs.samples(job.id),
            "checkpoints": lambda: list(other.jobs.checkpoints(job.id)),
        }
        codes = {}
        for name, call in calls.items():
            with pytest.raises(NotFoundError) as caught:
                call()
            codes[name] = (caught.value.status_code, caught.value.code)

    assert set(codes.values()) == {(404, "not_found")}, codes
    assert Job.objects.unscoped().get(public_id=job.id).status == JobStatus.CANCELLED
    assert [event.type for event in lab.jobs.events(job.id)] == ["job.queued", "job.cancelled"]


def test_it_lists_checkpoints_across_pages_and_shows_the_latest_ready_one(lab, spec):
    from jobs.models import Checkpoint, CheckpointStatus

    job = lab.jobs.create(spec)
    lab.jobs.cancel(job.id)
    stored = Job.objects.unscoped().get(public_id=job.id)
    made = [
        Checkpoint.objects.create(
            job=stored, step=step, attempt=1, format="peft-lora", status=status, size_bytes=10 * step, sha256="ab" * 32
        )
        for step, status in ((5, CheckpointStatus.READY), (10, CheckpointStatus.READY), (15, CheckpointStatus.FAILED))
    ]

    listed = list(lab.jobs.checkpoints(job.id, limit=1))
    latest = lab.jobs.retrieve(job.id).latest_checkpoint

    assert sorted(checkpoint.id for checkpoint in listed) == sorted(checkpoint.public_id for checkpoint in made)
    assert all(checkpoint.id.startswith("ckpt_") and checkpoint.job_id == job.id for checkpoint in listed)
    assert (latest.id, latest.step, latest.status, latest.size_bytes) == (made[1].public_id, 10, "ready", 100)
    assert latest.sha256 == "ab" * 32 and latest.created_at is not None


def _metric_steps(job_id: str, count: int) -> None:
    """Store ``count`` steps of ``reward/mean``: 0.5 everywhere, 0.25 at step 30, 1.5 at step 60."""
    from django.utils import timezone

    from jobs.models import MetricStep

    stored = Job.objects.unscoped().get(public_id=job_id)
    now = timezone.now()
    rewards = {30: 0.25, 60: 1.5}
    MetricStep.objects.bulk_create(
        MetricStep(job=stored, step=step, attempt=1, time=now, values={"reward/mean": rewards.get(step, 0.5)})
        for step in range(1, count + 1)
    )


def test_it_pages_metrics_by_step(lab, spec):
    job = lab.jobs.create(spec)
    _metric_steps(job.id, 25)

    points = list(lab.jobs.metrics(job.id, names=["reward/mean"], limit=10))
    after = list(lab.jobs.metrics(job.id, after_step=20, limit=2))

    assert [point.step for point in points] == list(range(1, 26))
    assert points[-1].values == {"reward/mean": 0.5}
    assert [point.step for point in after] == [21, 22, 23, 24, 25]


def test_downsampled_metrics_keep_the_last_step(live_server, lab, tenant, spec):
    import httpx

    job = lab.jobs.create(spec)
    _metric_steps(job.id, 100)

    response = httpx.get(
        f"{live_server.url}/api/v1/jobs/{job.id}/metrics",
        params={"max_points": 3, "names": "reward/mean"},
        headers={"Authorization": f"Bearer {tenant.key}"},
    )

    steps = [point["step"] for point in response.json()["data"]]
    assert len(steps) <= 3
    assert steps[0] == 1 and steps[-1] == 100, steps


def test_wait_with_progress_times_out_on_a_queued_job_and_ends_on_its_cancel(lab, spec):
    job = lab.jobs.create(spec)
    _metric_steps(job.id, 3)

    with pytest.raises(labsdk.WaitTimeoutError) as caught:
        lab.jobs.wait(job.id, timeout=1.5, progress=True, poll_interval=0.5)

    assert caught.value.job.id == job.id and caught.value.job.status == "queued"
    lab.jobs.cancel(job.id)
    with pytest.raises(labsdk.JobCancelledError) as ended:
        lab.jobs.wait(job.id, progress=True)
    assert ended.value.job.status == "cancelled"


def test_metadata_filters_take_keys_with_dots_quotes_and_brackets(lab, spec):
    keys = ["a.b", "a__b", "q'x", "[x]", "k=v&z", "é", " "]
    job = lab.jobs.create(spec, metadata={key: f"v{index}" for index, key in enumerate(keys)})
    lab.jobs.create(spec, metadata={key: "other" for key in keys})

    found = {
        key: [listed.id for listed in lab.jobs.list(metadata={key: f"v{index}"})] for index, key in enumerate(keys)
    }

    assert found == {key: [job.id] for key in keys}
