"""Adapter artifacts (jobs/adapters.py): the ingest routes, listing and download, outsiders,
hostile input, retention, a newer attempt's export, the adapter.ready webhook, job deletion
and the orphan sweep."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import storage
from jobs.checkpoints import checkpoint_sweep_orphans
from jobs.ingest.tokens import job_token
from jobs.models import Adapter, Job, JobEvent, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from lab.formats import iso

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    """Give every test an empty object storage directory."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "objects")}},
    }


def start(tenant, spec) -> tuple[Job, APIClient, str]:
    """Submit a job and claim its first attempt; return it, an engine client and its ingest base."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return Job.objects.unscoped().get(pk=job.pk), engine, f"/api/v1/ingest/jobs/{job.public_id}"


def upload(engine: APIClient, base: str, step: int, content: bytes, *, claimed: bytes | None = None, attempt: int = 1) -> dict:
    """Register an adapter, store ``content`` where Lab says, complete with the hash of ``claimed``."""
    registered = engine.post(f"{base}/adapters", {"attempt": attempt, "step": step, "format": "peft-lora"}, format="json")
    assert registered.status_code == 201, registered.content
    body = registered.json()
    assert body["id"].startswith("adp_") and body["upload"]["method"] == "local"
    Path(body["upload"]["path"]).write_bytes(content)
    claimed = content if claimed is None else claimed
    completed = engine.post(
        f"{base}/adapters/{body['id']}/complete",
        {"size_bytes": len(claimed), "sha256": hashlib.sha256(claimed).hexdigest()},
        format="json",
    )
    assert completed.status_code == 200, completed.content
    return {**body, "status": completed.json()["status"]}


def statuses(job: Job) -> list[tuple[int, str]]:
    return list(Adapter.objects.unscoped().filter(job=job).order_by("step").values_list("step", "status"))


def test_it_lists_and_streams_a_ready_adapter(owner, spec):
    spec["adapters"] = {"interval": 1}
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, 2, b"adapter bytes " * 100)
    assert adapter["status"] == "ready"

    listed = owner.client().get(f"/api/v1/jobs/{job.public_id}/adapters").json()
    row = Adapter.objects.unscoped().get(public_id=adapter["id"])
    assert listed == {
        "object": "list",
        "has_more": False,
        "data": [{
            "id": adapter["id"], "object": "adapter", "job_id": job.public_id, "step": 2, "attempt": 1,
            "status": "ready", "format": "peft-lora", "size_bytes": 1400,
            "sha256": hashlib.sha256(b"adapter bytes " * 100).hexdigest(),
            "created_at": iso(row.created_at),
        }],
    }
    answer = owner.client().get(f"/api/v1/adapters/{adapter['id']}/download", HTTP_ACCEPT="application/x-tar")
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == b"adapter bytes " * 100
    assert answer["Content-Length"] == "1400"
    assert answer["Content-Disposition"] == f'attachment; filename="{job.public_id}-step-000002-{adapter["id"]}.tar"'
    assert list(JobEvent.objects.filter(job=job, type="adapter.ready").values_list("data", flat=True)) == [
        {"adapter_id": adapter["id"], "step": 2}
    ]


def test_another_organizations_adapters_are_404_as_missing_ones(owner, outsider, spec):
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, 1, b"weights")
    assert owner.client().get(f"/api/v1/adapters/{adapter['id']}").json()["status"] == "ready"
    for path in (
        f"/api/v1/jobs/{job.public_id}/adapters",
        f"/api/v1/adapters/{adapter['id']}",
        f"/api/v1/adapters/{adapter['id']}/download",
    ):
        foreign = outsider.client().get(path)
        missing = outsider.client().get(path.replace(job.public_id, "job_missing").replace(adapter["id"], "adp_missing"))
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
    assert Adapter.objects.unscoped().get(public_id=adapter["id"]).status == "ready"


def test_a_tampered_upload_fails_is_not_downloadable_and_its_object_goes(owner, spec):
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, 1, b"what was stored", claimed=b"what was claimed")
    assert adapter["status"] == "failed"
    key = Adapter.objects.unscoped().get(public_id=adapter["id"]).storage_key
    assert not storage.path_of(key).exists() and not storage.path_of(storage.upload_key(key)).exists()
    download = owner.client().get(f"/api/v1/adapters/{adapter['id']}/download")
    assert download.status_code == 409 and download.json()["error"]["code"] == "adapter_not_ready"
    assert JobEvent.objects.filter(job=job, type="adapter.failed", level="warning").count() == 1
    assert not JobEvent.objects.filter(job=job, type="adapter.ready").exists()
    again = engine.post(f"{base}/adapters/{adapter['id']}/complete", {"size_bytes": 1, "sha256": "0" * 64}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_state"


def test_an_upload_arriving_after_the_adapter_is_ready_goes_with_the_next_completion(owner, spec):
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, 1, b"weights")
    key = Adapter.objects.unscoped().get(public_id=adapter["id"]).storage_key
    storage.path_of(storage.upload_key(key)).write_bytes(b"weights")
    again = engine.post(
        f"{base}/adapters/{adapter['id']}/complete",
        {"size_bytes": 7, "sha256": hashlib.sha256(b"weights").hexdigest()},
        format="json",
    )
    assert again.json()["status"] == "ready"
    assert not storage.path_of(storage.upload_key(key)).exists()
    assert storage.path_of(key).read_bytes() == b"weights"
    assert JobEvent.objects.filter(job=job, type="adapter.ready").count() == 1


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"attempt": 1, "step": 99, "format": "peft-lora"}, 409, "invalid_step", "step"),  # max_steps is 3
        ({"attempt": 1, "step": -1, "format": "peft-lora"}, 400, "invalid_request", "step"),
        ({"attempt": 1, "step": 1.5, "format": "peft-lora"}, 400, "invalid_request", "step"),
        ({"attempt": 1, "step": 1, "format": "pickle"}, 400, "invalid_request", "format"),
        ({"attempt": 2, "step": 1, "format": "peft-lora"}, 400, "invalid_request", "attempt"),
        ({"attempt": 1, "step": 1, "format": "peft-lora", "path": "/etc/passwd"}, 400, "invalid_request", "path"),
    ],
)
def test_a_hostile_registration_is_refused_and_creates_nothing(owner, spec, body, status, code, param):
    job, engine, base = start(owner, spec)
    answer = engine.post(f"{base}/adapters", body, format="json")
    assert answer.status_code == status, answer.content
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == (code, param)
    assert not Adapter.objects.unscoped().filter(job=job).exists()
    assert list(storage.iter_objects()) == []


def test_a_job_that_ended_takes_no_new_adapter(owner, spec):
    spec["adapters"] = {"interval": 1}
    job, engine, base = start(owner, spec)
    exported = upload(engine, base, 3, b"final adapter")
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    for step in (3, 2):
        late = engine.post(f"{base}/adapters", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json")
        assert (late.status_code, late.json()["error"]["code"]) == (409, "invalid_state")
        assert late.json()["error"]["message"] == "This job has ended (succeeded): it takes no new adapters."
    assert list(Adapter.objects.unscoped().filter(job=job).values_list("public_id", "status")) == [(exported["id"], "ready")]


def test_an_adapter_whose_archive_changed_in_storage_is_failed_instead_of_served(owner, spec):
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, 2, b"good adapter")
    served = owner.client().get(f"/api/v1/adapters/{adapter['id']}/download")
    assert served["X-Lab-Archive-SHA256"] == hashlib.sha256(b"good adapter").hexdigest()
    stored = storage.path_of(Adapter.objects.unscoped().get(public_id=adapter["id"]).storage_key)
    stored.write_bytes(b"evil adapter")

    answer = owner.client().get(f"/api/v1/adapters/{adapter['id']}/download")

    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "adapter_corrupted")
    assert statuses(job) == [(2, "failed")] and not stored.exists()
    event = JobEvent.objects.get(job=job, type="adapter.failed")
    assert (event.level, event.data) == ("warning", {"adapter_id": adapter["id"], "step": 2})
    assert event.message.startswith("Adapter of step 2 failed verification: its stored archive no longer matches")


def test_an_oversize_or_malformed_completion_is_refused_and_changes_nothing(owner, spec):
    job, engine, base = start(owner, spec)
    registered = engine.post(f"{base}/adapters", {"attempt": 1, "step": 1, "format": "hf-full"}, format="json").json()
    Path(registered["upload"]["path"]).write_bytes(b"x")
    route = f"{base}/adapters/{registered['id']}/complete"
    oversize = engine.post(route, {"size_bytes": 2**41, "sha256": "0" * 64}, format="json")
    assert oversize.status_code == 413 and oversize.json()["error"]["param"] == "size_bytes"
    malformed = engine.post(route, {"size_bytes": 1, "sha256": "ABC"}, format="json")
    assert malformed.status_code == 400 and malformed.json()["error"]["param"] == "sha256"
    huge_body = engine.post(route, {"size_bytes": 1, "sha256": "0" * 64, "pad": "x" * (2 * 1024 * 1024)}, format="json")
    assert huge_body.status_code == 413
    assert statuses(job) == [(1, "uploading")]
    assert Path(registered["upload"]["path"]).read_bytes() == b"x"


def test_another_jobs_token_cannot_complete_or_see_an_adapter(owner, spec):
    job, engine, base = start(owner, spec)
    other, other_engine, other_base = start(owner, spec)
    registered = engine.post(f"{base}/adapters", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    foreign = other_engine.post(f"{other_base}/adapters/{registered['id']}/complete", {"size_bytes": 1, "sha256": "0" * 64}, format="json")
    assert foreign.status_code == 404
    wrong_job = other_engine.post(f"{base}/adapters", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json")
    assert wrong_job.status_code == 401
    assert statuses(job) == [(1, "uploading")] and statuses(other) == []


def test_retention_keeps_the_newest_keep_last(owner, spec):
    spec["adapters"] = {"interval": 1, "keep_last": 2}
    job, engine, base = start(owner, spec)
    ids = [upload(engine, base, step, f"step {step}".encode())["id"] for step in (1, 2, 3)]
    assert statuses(job) == [(1, "deleted"), (2, "ready"), (3, "ready")]
    assert sorted(key for key, _ in storage.iter_objects()) == sorted(
        Adapter.objects.unscoped().get(public_id=adapter_id).storage_key for adapter_id in ids[1:]
    )
    assert owner.client().get(f"/api/v1/adapters/{ids[0]}/download").status_code == 409


@pytest.mark.parametrize("adapters", [{"interval": 1, "keep_last": -1}, {"interval": 1}, None])
def test_retention_keeps_every_adapter_with_minus_one_or_by_default(owner, spec, adapters):
    if adapters is not None:
        spec["adapters"] = adapters
    job, engine, base = start(owner, spec)
    for step in (1, 2, 3):
        upload(engine, base, step, f"step {step}".encode())
    assert statuses(job) == [(1, "ready"), (2, "ready"), (3, "ready")]


def test_a_newer_attempt_replaces_an_older_attempts_adapter_of_the_same_step(owner, spec):
    job, engine, base = start(owner, spec)
    first = upload(engine, base, 2, b"attempt one")
    old_key = Adapter.objects.unscoped().get(public_id=first["id"]).storage_key
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, message="preempted")
    attempt = job_claim_for_start(job_id=job.pk)
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    second = upload(engine, base, 2, b"attempt two", attempt=2)
    assert second["id"] == first["id"]
    row = Adapter.objects.unscoped().get(public_id=first["id"])
    assert (row.attempt, row.status, row.size_bytes) == (2, "ready", len(b"attempt two"))
    assert not storage.path_of(old_key).exists()
    answer = owner.client().get(f"/api/v1/adapters/{first['id']}/download")
    assert b"".join(answer.streaming_content) == b"attempt two"


def test_the_adapter_ready_webhook_links_to_the_download(owner, spec, settings):
    from jobs.webhooks.endpoints import endpoint_create
    from jobs.webhooks.models import WebhookMessage

    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    endpoint_create(
        project=owner.project, actor=Actor(user=owner.user),
        data={"url": "http://127.0.0.1:9/hook", "events": ["adapter.ready"]},
    )
    job, engine, base = start(owner, spec)
    upload(engine, base, 1, b"bad", claimed=b"other")  # a failed adapter sends nothing
    adapter = upload(engine, base, 3, b"weights")
    messages = list(WebhookMessage.objects.filter(project=owner.project).values_list("type", "body"))
    assert [kind for kind, _ in messages] == ["adapter.ready"]
    data = json.loads(messages[0][1])["data"]
    assert data == {
        "job_id": job.public_id,
        "adapter_id": adapter["id"],
        "step": 3,
        "download_url": f"{settings.LAB_PUBLIC_URL}/api/v1/adapters/{adapter['id']}/download",
    }
    answer = owner.client().get(data["download_url"].removeprefix(settings.LAB_PUBLIC_URL))
    assert b"".join(answer.streaming_content) == b"weights"


def test_deleting_a_job_deletes_its_adapters_objects(owner, spec):
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, 1, b"weights")
    path = storage.path_of(Adapter.objects.unscoped().get(public_id=adapter["id"]).storage_key)
    assert path.exists()
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    assert owner.client().delete(f"/api/v1/jobs/{job.public_id}").status_code == 204
    assert not path.exists()
    assert not Adapter.objects.unscoped().filter(public_id=adapter["id"]).exists()
    assert owner.client().get(f"/api/v1/adapters/{adapter['id']}/download").status_code == 404


def test_the_orphan_sweep_spares_adapters_and_fails_abandoned_uploads(owner, spec, settings):
    settings.LAB_ORPHAN_GRACE_S = 3600
    job, engine, base = start(owner, spec)
    kept = upload(engine, base, 1, b"kept")
    kept_path = storage.path_of(Adapter.objects.unscoped().get(public_id=kept["id"]).storage_key)
    abandoned = engine.post(f"{base}/adapters", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    upload_path = Path(abandoned["upload"]["path"])
    upload_path.write_bytes(b"half")
    orphan = storage.path_of(f"{job.public_id}/adapters/adp_gone-a1.tar")
    orphan.write_bytes(b"left behind")
    two_hours_ago = time.time() - 7200
    for path in (kept_path, upload_path, orphan):
        os.utime(path, (two_hours_ago, two_hours_ago))
    assert checkpoint_sweep_orphans() == 1  # the attempt is still running: its upload stays
    assert kept_path.exists() and upload_path.exists() and not orphan.exists()
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.FAILED)
    checkpoint_sweep_orphans(now=timezone.now() + timedelta(hours=2))
    assert statuses(job) == [(1, "ready"), (2, "failed")]
    assert kept_path.exists() and not upload_path.exists()


def test_the_openapi_document_has_the_adapter_routes(owner):
    document = owner.client().get("/api/v1/schema", HTTP_ACCEPT="application/json").json()
    assert "/api/v1/jobs/{job_id}/adapters" in document["paths"]
    assert "/api/v1/adapters/{adapter_id}" in document["paths"]
    download = document["paths"]["/api/v1/adapters/{adapter_id}/download"]["get"]
    assert download["operationId"] == "adapters_download"
    assert "Adapter" in document["components"]["schemas"]


def test_an_adapter_left_in_an_exited_engines_spool_is_delivered_once(owner, spec, tmp_path):
    from engine.checkpoints import write_tar
    from jobs.ingest.spool import deliver_attempt_spool
    from tests.support.spool import launched, spool

    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    directory = workdir / "adapters" / "step-000003"
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text("{}")
    archive = directory.with_name("step-000003.tar")
    size, digest = write_tar(directory, archive)
    outside = tmp_path / "elsewhere.tar"
    outside.write_bytes(b"not the engine's")
    spool(workdir, "adapters", [
        {"step": 3, "format": "peft-lora", "archive": str(archive), "size_bytes": size, "sha256": digest},
        {"step": 2, "format": "peft-lora", "archive": str(outside), "size_bytes": 16, "sha256": "0" * 64},
    ])
    first = deliver_attempt_spool(attempt=attempt, workdir=workdir)
    again = deliver_attempt_spool(attempt=attempt, workdir=workdir)
    assert first.delivered == {"adapters": 2} and again.delivered == {}
    assert statuses(job) == [(2, "failed"), (3, "ready")]  # nothing is copied from outside the work dir
    ready = Adapter.objects.unscoped().get(job=job, step=3)
    assert (ready.size_bytes, ready.sha256) == (size, digest)


def test_an_ended_attempts_unfinished_adapter_upload_fails_at_once(owner, spec, tmp_path, monkeypatch):
    from jobs.launchers import registry
    from jobs.pipeline import reconciler
    from tests.support.spool import exited_launcher, launched, point, spool

    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    spool(workdir, "metrics", [point(1), point(2), point(3)])
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    base = f"/api/v1/ingest/jobs/{job.public_id}"
    ready = upload(engine, base, 1, b"done")
    stuck = engine.post(f"{base}/adapters", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    Path(stuck["upload"]["path"]).write_bytes(b"half")
    monkeypatch.setattr(registry, "get_launcher", exited_launcher)

    reconciler.reconcile_job(job_id=job.pk)

    assert Job.objects.unscoped().get(pk=job.pk).status == "succeeded"
    assert statuses(job) == [(1, "ready"), (2, "failed")]
    assert not Path(stuck["upload"]["path"]).exists()
    failed = JobEvent.objects.get(job=job, type="adapter.failed")
    assert failed.message == "Adapter of step 2 failed: attempt 1 ended before completing its upload."
    assert Adapter.objects.unscoped().get(public_id=ready["id"]).status == "ready"


@pytest.mark.parametrize(
    ("adapters", "param", "code"),
    [
        ({"keep_last": 0}, "adapters.keep_last", "out_of_range"),
        ({"keep_last": -2}, "adapters.keep_last", None),
        ({"interval": -1}, "adapters.interval", None),
        ({"interval": 1, "keep": 3}, "adapters.keep", None),
    ],
)
def test_a_bad_adapters_section_is_a_400_and_creates_no_job(owner, spec, adapters, param, code):
    answer = owner.client().post("/api/v1/jobs", {**spec, "adapters": adapters}, format="json")
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    if code:
        assert error["errors"][0]["code"] == code
    assert not Job.objects.unscoped().exists()


def test_on_s3_the_engine_puts_to_a_signed_url_and_a_download_redirects(owner, spec, s3_server, bucket, tmp_path):
    from engine.reporter import HttpTransport

    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    token = job_token(job_claim_for_start(job_id=job.pk))
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    base = f"/api/v1/ingest/jobs/{job.public_id}"
    registered = engine.post(f"{base}/adapters", {"attempt": 1, "step": 3, "format": "peft-lora"}, format="json").json()
    assert registered["upload"]["method"] == "put"
    content = b"lora weights" * 50
    archive = tmp_path / "adapter.tar"
    archive.write_bytes(content)
    HttpTransport("http://127.0.0.1:9", job.public_id, token).upload(registered["upload"], archive)
    completed = engine.post(
        f"{base}/adapters/{registered['id']}/complete",
        {"size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}, format="json",
    )
    assert completed.json() == {"id": registered["id"], "status": "ready"}
    key = f"lab/checkpoints/{job.public_id}/adapters/{registered['id']}-a1.tar"
    assert s3_server.keys(bucket) == [key]  # the upload was sealed into the archive key
    answer = owner.client().get(f"/api/v1/adapters/{registered['id']}/download")
    assert answer.status_code == 302 and answer["Cache-Control"] == "no-store"
    assert httpx.get(answer["Location"], timeout=10).content == content
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    assert owner.client().delete(f"/api/v1/jobs/{job.public_id}").status_code == 204
    assert s3_server.keys(bucket) == []


def test_an_older_attempt_cannot_complete_a_step_a_newer_attempt_took_over(owner, spec):
    job, old_engine, base = start(owner, spec)
    registered = old_engine.post(f"{base}/adapters", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    Path(registered["upload"]["path"]).write_bytes(b"attempt one")
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, message="preempted")
    new_engine = APIClient()
    new_engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(job_claim_for_start(job_id=job.pk))}")
    taken = new_engine.post(f"{base}/adapters", {"attempt": 2, "step": 2, "format": "peft-lora"}, format="json").json()
    assert taken["id"] == registered["id"]

    late = old_engine.post(
        f"{base}/adapters/{registered['id']}/complete",
        {"size_bytes": 11, "sha256": hashlib.sha256(b"attempt one").hexdigest()}, format="json",
    )
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
    assert statuses(job) == [(2, "uploading")]
    Path(taken["upload"]["path"]).write_bytes(b"attempt two")
    done = new_engine.post(
        f"{base}/adapters/{taken['id']}/complete",
        {"size_bytes": 11, "sha256": hashlib.sha256(b"attempt two").hexdigest()}, format="json",
    )
    assert done.json()["status"] == "ready"


def test_the_list_pages_newest_first_with_limit_and_after(owner, spec):
    job, engine, base = start(owner, spec)
    ids = [upload(engine, base, step, f"step {step}".encode())["id"] for step in (1, 2, 3)]
    route = f"/api/v1/jobs/{job.public_id}/adapters"
    first = owner.client().get(route, {"limit": 2}).json()
    assert ([a["id"] for a in first["data"]], first["has_more"]) == ([ids[2], ids[1]], True)
    rest = owner.client().get(route, {"limit": 2, "after": ids[1]}).json()
    assert ([a["id"] for a in rest["data"]], rest["has_more"]) == ([ids[0]], False)
    bad = owner.client().get(route, {"limit": 1000})
    assert bad.status_code == 400
