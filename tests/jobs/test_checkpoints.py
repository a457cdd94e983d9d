"""The checkpoint lifecycle on the filesystem backend (jobs/checkpoints.py): upload and verify,
download, retention, deleting a job, the orphan sweep, and the engine's own download."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import storage
from jobs.checkpoints import checkpoint_sweep_orphans
from jobs.ingest.tokens import job_token
from jobs.models import Checkpoint, Job, JobEvent, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from jobs.tasks import sweep_orphan_checkpoints
from lab.audit import Actor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    """Give every test an empty checkpoint directory, so the sweep sees only this test's files."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "checkpoints")}},
    }


def start(tenant, spec) -> tuple[Job, APIClient, str]:
    """Submit a job and claim its first attempt; return it, an engine client and its ingest base."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return Job.objects.unscoped().get(pk=job.pk), engine, f"/api/v1/ingest/jobs/{job.public_id}"


def upload(engine: APIClient, base: str, step: int, content: bytes, *, claimed: bytes | None = None) -> dict:
    """Register, store ``content`` where Lab says, complete with the hash of ``claimed`` (default: content)."""
    registered = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json")
    assert registered.status_code == 201, registered.content
    body = registered.json()
    assert body["upload"]["method"] == "local"
    Path(body["upload"]["path"]).write_bytes(content)
    claimed = content if claimed is None else claimed
    completed = engine.post(
        f"{base}/checkpoints/{body['id']}/complete",
        {"size_bytes": len(claimed), "sha256": hashlib.sha256(claimed).hexdigest()},
        format="json",
    )
    assert completed.status_code == 200, completed.content
    return {**body, "status": completed.json()["status"]}


def next_attempt(job: Job) -> APIClient:
    """Requeue ``job`` as a preemption does, claim its next attempt, return that attempt's engine client."""
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, message="preempted")
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(job_claim_for_start(job_id=job.pk))}")
    return engine


def finish(job: Job) -> None:
    """End a job that its engine's reports made ``running``."""
    job = Job.objects.unscoped().get(pk=job.pk)
    assert job.status == JobStatus.RUNNING
    job_transition(job=job, to=JobStatus.SUCCEEDED)


def test_it_streams_a_ready_checkpoint_with_length_and_file_name(owner, spec):
    job, engine, base = start(owner, spec)
    archive = b"tar bytes " * 1000
    ckpt = upload(engine, base, 3, archive)
    answer = owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download", HTTP_ACCEPT="application/x-tar")
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == archive
    assert answer["Content-Length"] == str(len(archive))
    assert answer["Content-Type"] == "application/x-tar"
    assert answer["Content-Disposition"] == f'attachment; filename="{job.public_id}-step-000003-{ckpt["id"]}.tar"'


def test_an_upload_changed_after_sealing_changes_nothing_lab_serves(owner, spec):
    job, engine, base = start(owner, spec)
    registered = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 3, "format": "peft-lora"}, format="json").json()
    upload_path = Path(registered["upload"]["path"])
    archive = b"verified bytes " * 100
    with upload_path.open("wb") as held_open:
        held_open.write(archive)
        held_open.flush()
        completed = engine.post(
            f"{base}/checkpoints/{registered['id']}/complete",
            {"size_bytes": len(archive), "sha256": hashlib.sha256(archive).hexdigest()},
            format="json",
        )
        assert completed.json()["status"] == "ready"
        held_open.write(b"written through a handle kept open")  # reaches the upload's old file only
    upload_path.write_bytes(b"written to the upload path again")
    answer = owner.client().get(f"/api/v1/checkpoints/{registered['id']}/download")
    assert b"".join(answer.streaming_content) == archive
    assert answer["Content-Length"] == str(len(archive))
    stored = storage.path_of(Checkpoint.objects.unscoped().get(public_id=registered["id"]).storage_key)
    assert stored != upload_path and stored.read_bytes() == archive


def test_it_answers_404_for_another_organizations_checkpoint_as_for_a_missing_one(owner, outsider, spec):
    _, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 1, b"mine")
    foreign = outsider.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download")
    missing = outsider.client().get("/api/v1/checkpoints/ckpt_doesnotexist/download")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
    assert foreign.json()["error"]["message"] == missing.json()["error"]["message"]


@pytest.mark.parametrize("bad_id", ["ckpt_" + "x" * 200, "..%2F..%2Fsecret_key", "job_abc", "%20", "ckpt_%E2%9C%93"])
def test_it_answers_404_for_malformed_checkpoint_ids(owner, bad_id):
    answer = owner.client().get(f"/api/v1/checkpoints/{bad_id}/download")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


def test_it_answers_400_for_a_nul_in_a_checkpoint_id(owner):
    answer = owner.client().get("/api/v1/checkpoints/ckpt_%00/download")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"


def test_it_refuses_to_download_a_checkpoint_that_is_not_ready(owner, spec):
    _, engine, base = start(owner, spec)
    uploading = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    failed = upload(engine, base, 2, b"stored", claimed=b"claimed")
    assert failed["status"] == "failed"
    for ckpt_id, status in ((uploading["id"], "uploading"), (failed["id"], "failed")):
        answer = owner.client().get(f"/api/v1/checkpoints/{ckpt_id}/download")
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "checkpoint_not_ready"
        assert status in answer.json()["error"]["message"]
        assert Checkpoint.objects.unscoped().get(public_id=ckpt_id).status == status


def test_it_marks_a_tampered_upload_failed_and_deletes_what_was_stored(owner, spec):
    job, engine, base = start(owner, spec)
    registered = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 3, "format": "peft-lora"}, format="json").json()
    path = Path(registered["upload"]["path"])
    path.write_bytes(b"original weights")
    digest = hashlib.sha256(b"original weights").hexdigest()
    path.write_bytes(b"tampered weights")  # same size, other bytes
    answer = engine.post(
        f"{base}/checkpoints/{registered['id']}/complete", {"size_bytes": 16, "sha256": digest}, format="json"
    )
    assert answer.json() == {"id": registered["id"], "status": "failed"}
    checkpoint = Checkpoint.objects.unscoped().get(public_id=registered["id"])
    assert (checkpoint.status, checkpoint.size_bytes, checkpoint.sha256) == ("failed", None, "")
    assert not path.exists()
    event = JobEvent.objects.get(job=job, type="checkpoint.failed")
    assert event.data == {"checkpoint_id": registered["id"], "step": 3}
    again = engine.post(f"{base}/checkpoints/{registered['id']}/complete", {"size_bytes": 16, "sha256": digest}, format="json")
    assert again.status_code == 409


def test_a_size_that_differs_fails_without_hashing_and_says_what_was_found(owner, spec):
    job, engine, base = start(owner, spec)
    registered = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    Path(registered["upload"]["path"]).write_bytes(b"short")
    answer = engine.post(
        f"{base}/checkpoints/{registered['id']}/complete",
        {"size_bytes": 6, "sha256": hashlib.sha256(b"short!").hexdigest()},
        format="json",
    )
    assert answer.json() == {"id": registered["id"], "status": "failed"}
    event = JobEvent.objects.get(job=job, type="checkpoint.failed")
    assert event.message == "Checkpoint of step 2 failed verification: found 5 bytes, not the 6 reported."
    nothing = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 3, "format": "peft-lora"}, format="json").json()
    engine.post(f"{base}/checkpoints/{nothing['id']}/complete", {"size_bytes": 6, "sha256": "0" * 64}, format="json")
    assert JobEvent.objects.filter(job=job, type="checkpoint.failed").latest("id").message == (
        "Checkpoint of step 3 failed verification: found nothing."
    )


def test_completing_a_ready_checkpoint_again_changes_nothing(owner, spec):
    job, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 1, b"weights")
    before = Checkpoint.objects.unscoped().get(public_id=ckpt["id"])
    again = engine.post(
        f"{base}/checkpoints/{ckpt['id']}/complete", {"size_bytes": 1, "sha256": "0" * 64}, format="json"
    )
    assert again.json() == {"id": ckpt["id"], "status": "ready"}
    after = Checkpoint.objects.unscoped().get(public_id=ckpt["id"])
    assert (after.status, after.size_bytes, after.sha256, after.ready_at) == (
        before.status, before.size_bytes, before.sha256, before.ready_at
    )
    assert JobEvent.objects.filter(job=job, type="checkpoint.ready").count() == 1


def test_an_upload_arriving_after_the_checkpoint_is_ready_goes_with_the_next_completion(owner, spec):
    # An exited engine's spool, delivered by Lab while the engine's own completion was sealing the
    # same checkpoint, stores the archive again at the upload key and completes a ready checkpoint.
    job, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 1, b"weights")
    key = Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).storage_key
    storage.path_of(storage.upload_key(key)).write_bytes(b"weights")
    again = engine.post(
        f"{base}/checkpoints/{ckpt['id']}/complete",
        {"size_bytes": 7, "sha256": hashlib.sha256(b"weights").hexdigest()},
        format="json",
    )
    assert again.json() == {"id": ckpt["id"], "status": "ready"}
    assert not storage.path_of(storage.upload_key(key)).exists()
    assert storage.path_of(key).read_bytes() == b"weights"
    assert JobEvent.objects.filter(job=job, type="checkpoint.ready").count() == 1


def test_it_refuses_to_complete_another_jobs_checkpoint(owner, spec):
    _, engine_a, base_a = start(owner, spec)
    _, engine_b, base_b = start(owner, spec)
    ckpt = engine_a.post(f"{base_a}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    Path(ckpt["upload"]["path"]).write_bytes(b"a")
    answer = engine_b.post(
        f"{base_b}/checkpoints/{ckpt['id']}/complete", {"size_bytes": 1, "sha256": hashlib.sha256(b"a").hexdigest()}, format="json"
    )
    assert answer.status_code == 404
    assert Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).status == "uploading"


@pytest.mark.parametrize(
    "body",
    [{}, {"size_bytes": -1, "sha256": "0" * 64}, {"size_bytes": 1, "sha256": "xyz"}, {"size_bytes": "many", "sha256": "0" * 64}],
)
def test_it_refuses_a_malformed_completion_and_changes_nothing(owner, spec, body):
    _, engine, base = start(owner, spec)
    ckpt = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    answer = engine.post(f"{base}/checkpoints/{ckpt['id']}/complete", body, format="json")
    assert answer.status_code == 400
    assert Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).status == "uploading"


def test_retention_keeps_the_newest_keep_last_and_the_final_one(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_last": 2}
    spec["max_steps"] = 4
    job, engine, base = start(owner, spec)
    ids = [upload(engine, base, step, f"step {step}".encode())["id"] for step in (1, 2, 3, 4)]
    statuses = list(Checkpoint.objects.unscoped().filter(job=job).order_by("step").values_list("public_id", "status"))
    assert statuses == [(ids[0], "deleted"), (ids[1], "deleted"), (ids[2], "ready"), (ids[3], "ready")]
    assert sorted(key for key, _ in storage.iter_objects() if key.startswith(job.public_id)) == sorted(
        f"{job.public_id}/{ckpt_id}.tar" for ckpt_id in ids[2:]
    )


def test_retention_keeps_every_checkpoint_with_primes_keep_cloud_minus_one(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_cloud": -1}
    spec["max_steps"] = 3
    job, engine, base = start(owner, spec)
    assert job.spec["checkpoints"] == {"interval": 1, "keep_last": -1}
    for step in (1, 2, 3):
        upload(engine, base, step, f"step {step}".encode())
    assert list(Checkpoint.objects.unscoped().filter(job=job).values_list("status", flat=True)) == ["ready"] * 3


def test_a_deleted_checkpoint_stays_listed_without_a_download_and_its_removal_is_streamed(owner, spec):
    from jobs.stream.records import read_after

    spec["checkpoints"] = {"interval": 1, "keep_last": 1}
    job, engine, base = start(owner, spec)
    first = upload(engine, base, 1, b"first")["id"]
    upload(engine, base, 2, b"second")
    listed = owner.client().get(f"/api/v1/jobs/{job.public_id}/checkpoints").json()["data"]
    assert [(c["id"], c["status"]) for c in listed if c["id"] == first] == [(first, "deleted")]
    download = owner.client().get(f"/api/v1/checkpoints/{first}/download")
    assert download.status_code == 409 and download.json()["error"]["code"] == "checkpoint_not_ready"
    replay, complete = read_after(job.pk, 0)
    states = [json.loads(r.data)["status"] for r in replay if r.event == "checkpoint" and json.loads(r.data)["id"] == first]
    assert complete and states == ["uploading", "ready", "deleted"]


def test_retention_keeps_a_checkpoint_that_a_queued_job_starts_from(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_last": 1}
    source, engine, base = start(owner, spec)
    first = upload(engine, base, 1, b"first")["id"]
    follower = job_submit(project=owner.project, actor=Actor(user=owner.user), data={**spec, "init_from": first})
    assert follower.status == JobStatus.QUEUED
    second = upload(engine, base, 2, b"second")["id"]
    ready = Checkpoint.objects.unscoped().filter(job=source, status="ready")
    assert set(ready.values_list("public_id", flat=True)) == {first, second}
    third = upload(engine, base, 3, b"third")["id"]
    # The follower still needs the first; the second is neither newest nor needed.
    assert set(ready.values_list("public_id", flat=True)) == {first, third}
    assert Checkpoint.objects.unscoped().get(public_id=second).status == "deleted"


def test_deleting_a_job_deletes_its_archives(owner, spec):
    job, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 1, b"weights")
    path = storage.path_of(Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).storage_key)
    assert path.exists()
    finish(job)
    assert owner.client().delete(f"/api/v1/jobs/{job.public_id}").status_code == 204
    assert not path.exists()
    assert not path.parent.exists()
    assert owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download").status_code == 404


def test_the_orphan_sweep_removes_old_objects_without_a_row_and_spares_young_ones(owner, spec, settings):
    settings.LAB_ORPHAN_GRACE_S = 3600
    job, engine, base = start(owner, spec)
    kept = upload(engine, base, 1, b"kept")
    kept_path = storage.path_of(Checkpoint.objects.unscoped().get(public_id=kept["id"]).storage_key)
    old_orphan = storage.path_of(f"{job.public_id}/ckpt_gone.tar")
    old_orphan.write_bytes(b"left behind")
    young_orphan = storage.path_of("job_notyet/ckpt_uploading.tar.partial")
    young_orphan.parent.mkdir(parents=True, exist_ok=True)
    young_orphan.write_bytes(b"being written")
    two_hours_ago = time.time() - 7200
    for path in (kept_path, old_orphan):
        os.utime(path, (two_hours_ago, two_hours_ago))
    assert sweep_orphan_checkpoints() == 1  # the beat task
    assert "sweep-orphan-checkpoints" in {
        name for name, entry in settings.CELERY_BEAT_SCHEDULE.items() if entry["task"] == sweep_orphan_checkpoints.name
    }
    assert not old_orphan.exists()
    assert kept_path.exists() and young_orphan.exists()
    assert checkpoint_sweep_orphans() == 0  # idempotent
    # Past its grace period the abandoned upload goes too.
    assert checkpoint_sweep_orphans(now=timezone.now() + timedelta(hours=2)) == 1
    assert not young_orphan.exists()
    assert kept_path.exists()


def test_the_ready_webhook_links_to_the_download_endpoint(owner, spec, settings):
    from jobs.webhooks.endpoints import endpoint_create
    from jobs.webhooks.models import WebhookMessage

    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    endpoint_create(
        project=owner.project,
        actor=Actor(user=owner.user),
        data={"url": "http://127.0.0.1:9/hook", "events": ["checkpoint.ready"]},
    )
    job, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 2, b"weights")
    data = json.loads(WebhookMessage.objects.get(type="checkpoint.ready").body)["data"]
    assert data == {
        "job_id": job.public_id,
        "checkpoint_id": ckpt["id"],
        "step": 2,
        "download_url": f"{settings.LAB_PUBLIC_URL}/api/v1/checkpoints/{ckpt['id']}/download",
    }
    answer = owner.client().get(data["download_url"].removeprefix(settings.LAB_PUBLIC_URL))
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == b"weights"


def test_an_engine_downloads_its_init_checkpoint_but_no_other(owner, outsider, spec):
    _, engine, base = start(owner, spec)
    init = upload(engine, base, 1, b"init weights")["id"]
    _, unrelated_engine, unrelated_base = start(owner, spec)
    unrelated = upload(unrelated_engine, unrelated_base, 1, b"other")["id"]
    _, foreign_engine, foreign_base = start(outsider, spec)
    foreign = upload(foreign_engine, foreign_base, 1, b"foreign")["id"]
    follower, follower_engine, follower_base = start(owner, {**spec, "init_from": init})
    assert follower.init_from.public_id == init
    answer = follower_engine.get(f"{follower_base}/checkpoints/{init}/download")
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == b"init weights"
    for other in (unrelated, foreign, "ckpt_unknown", "x" * 300):
        refused = follower_engine.get(f"{follower_base}/checkpoints/{other}/download")
        assert refused.status_code == 404, other
    anonymous = APIClient().get(f"{follower_base}/checkpoints/{init}/download")
    assert anonymous.status_code == 401
    wrong_job = follower_engine.get(f"{base}/checkpoints/{init}/download")
    assert wrong_job.status_code == 401


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", {"BACKEND": "django.core.files.storage.FileSystemStorage"}),
        ("s3://bucket", {"BACKEND": "storages.backends.s3.S3Storage", "bucket_name": "bucket", "location": ""}),
        ("s3://bucket/a/b/", {"BACKEND": "storages.backends.s3.S3Storage", "bucket_name": "bucket", "location": "a/b"}),
    ],
)
def test_lab_storage_url_chooses_the_backend(url, expected, monkeypatch):
    from lab.settings import _checkpoint_storage

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    entry = _checkpoint_storage(url)
    assert entry["BACKEND"] == expected["BACKEND"]
    for name in ("bucket_name", "location"):
        if name in expected:
            assert entry["OPTIONS"][name] == expected[name]
    if url:
        assert entry["OPTIONS"]["endpoint_url"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize("url", ["gs://bucket/x", "s3://", "s3:/bucket", "/tmp/checkpoints"])
def test_a_malformed_lab_storage_url_stops_startup(url):
    from django.core.exceptions import ImproperlyConfigured

    from lab.settings import _checkpoint_storage

    with pytest.raises(ImproperlyConfigured, match="LAB_STORAGE_URL must be empty or s3://bucket"):
        _checkpoint_storage(url)


def test_a_download_answers_whatever_the_client_accepts(owner, spec):
    _, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 1, b"bytes")
    for accept in ("application/x-tar", "*/*", "text/html", "application/json"):
        answer = owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download", HTTP_ACCEPT=accept)
        assert answer.status_code == 200, accept
    refused = owner.client().get("/api/v1/checkpoints/ckpt_missing/download", HTTP_ACCEPT="application/x-tar")
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "not_found"


def test_a_read_only_key_downloads(owner, spec):
    from lab.services import api_key_create

    _, engine, base = start(owner, spec)
    ckpt = upload(engine, base, 1, b"bytes")
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    assert owner.client(key).get(f"/api/v1/checkpoints/{ckpt['id']}/download").status_code == 200


def test_the_sweep_fails_uploads_that_their_attempt_abandoned(owner, spec, settings):
    settings.LAB_ORPHAN_GRACE_S = 3600
    ended, ended_engine, ended_base = start(owner, spec)
    abandoned = ended_engine.post(f"{ended_base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    Path(abandoned["upload"]["path"]).write_bytes(b"half an upl")
    _, running_engine, running_base = start(owner, spec)
    in_progress = running_engine.post(f"{running_base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    Path(in_progress["upload"]["path"]).write_bytes(b"still going")
    finish(ended)
    assert checkpoint_sweep_orphans() == 0  # inside the grace period nothing changes
    assert Checkpoint.objects.unscoped().get(public_id=abandoned["id"]).status == "uploading"

    later = timezone.now() + timedelta(hours=2)
    checkpoint_sweep_orphans(now=later)
    assert Checkpoint.objects.unscoped().get(public_id=abandoned["id"]).status == "failed"
    assert not Path(abandoned["upload"]["path"]).exists()
    event = JobEvent.objects.get(job=ended, type="checkpoint.failed")
    assert event.message == "Checkpoint of step 1 failed: attempt 1 ended before completing its upload."
    # The running attempt may still complete its upload.
    assert Checkpoint.objects.unscoped().get(public_id=in_progress["id"]).status == "uploading"
    assert Path(in_progress["upload"]["path"]).exists()
    checkpoint_sweep_orphans(now=later)
    assert JobEvent.objects.filter(type="checkpoint.failed").count() == 1


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"attempt": 1, "step": 1, "format": "safetensors"}, 400, "format"),
        ({"attempt": 1, "step": -1, "format": "peft-lora"}, 400, "step"),
        ({"attempt": 1, "format": "peft-lora"}, 400, "step"),
        ({"attempt": 2, "step": 1, "format": "peft-lora"}, 400, "attempt"),
        ({"attempt": "one", "step": 1, "format": "peft-lora"}, 400, "attempt"),
        ({"attempt": 1, "step": 4, "format": "peft-lora"}, 409, "step"),  # max_steps is 3
        ({"attempt": 1, "step": 999999, "format": "peft-lora"}, 409, "step"),
    ],
)
def test_a_malformed_registration_is_refused_and_creates_nothing(owner, spec, body, status, param):
    job, engine, base = start(owner, spec)
    answer = engine.post(f"{base}/checkpoints", body, format="json")
    assert answer.status_code == status, answer.content
    assert answer.json()["error"]["param"] == param
    assert not Checkpoint.objects.unscoped().filter(job=job).exists()
    assert list(storage.iter_objects()) == []


@pytest.mark.parametrize("bad_id", ["ckpt_" + "x" * 300, "ckpt_unknown", "..%2F..%2Fx"])
def test_completing_an_unknown_or_malformed_checkpoint_id_is_a_404(owner, spec, bad_id):
    _, engine, base = start(owner, spec)
    answer = engine.post(f"{base}/checkpoints/{bad_id}/complete", {"size_bytes": 1, "sha256": "0" * 64}, format="json")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


def test_a_job_that_ended_takes_no_new_checkpoint_and_keeps_its_latest(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_last": 1}
    job, engine, base = start(owner, spec)  # max_steps 3
    real = upload(engine, base, 3, b"real weights")
    beyond = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 4, "format": "peft-lora"}, format="json")
    assert (beyond.status_code, beyond.json()["error"]["code"], beyond.json()["error"]["message"]) == (
        409, "invalid_step", "checkpoint for step 4: this job has 3 steps."
    )
    finish(job)
    for step in (999999, 3, 2):
        late = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json")
        assert late.status_code == 409, step
        assert late.json()["error"] == {
            "type": "conflict_error", "code": "invalid_state", "param": None, "errors": [],
            "message": "This job has ended (succeeded): it takes no new checkpoints.",
        }
    assert list(Checkpoint.objects.unscoped().filter(job=job).values_list("public_id", "step", "status")) == [
        (real["id"], 3, "ready")
    ]
    assert owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["latest_checkpoint"]["id"] == real["id"]
    assert [key for key, _ in storage.iter_objects()] == [Checkpoint.objects.unscoped().get().storage_key]


def test_only_the_current_attempt_that_registered_a_checkpoint_completes_it(owner, spec):
    job, first, base = start(owner, spec)
    own = first.post(f"{base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    Path(own["upload"]["path"]).write_bytes(b"attempt one")
    second = next_attempt(job)
    newer = second.post(f"{base}/checkpoints", {"attempt": 2, "step": 2, "format": "peft-lora"}, format="json").json()
    Path(newer["upload"]["path"]).write_bytes(b"attempt two")
    digests = {own["id"]: hashlib.sha256(b"attempt one").hexdigest(), newer["id"]: hashlib.sha256(b"attempt two").hexdigest()}

    # The superseded attempt completes neither the newer attempt's checkpoint nor its own; the newer
    # attempt does not complete the older one's.
    for engine, checkpoint_id in ((first, newer["id"]), (first, own["id"]), (second, own["id"])):
        late = engine.post(
            f"{base}/checkpoints/{checkpoint_id}/complete", {"size_bytes": 11, "sha256": digests[checkpoint_id]}, format="json"
        )
        assert (late.status_code, late.json()["error"]["code"], late.json()["error"]["param"]) == (409, "stale_attempt", "attempt")
    assert dict(Checkpoint.objects.unscoped().filter(job=job).values_list("public_id", "status")) == {
        own["id"]: "uploading", newer["id"]: "uploading"
    }
    assert Path(newer["upload"]["path"]).read_bytes() == b"attempt two"  # nothing sealed
    done = second.post(
        f"{base}/checkpoints/{newer['id']}/complete", {"size_bytes": 11, "sha256": digests[newer["id"]]}, format="json"
    )
    assert done.json() == {"id": newer["id"], "status": "ready"}


def test_an_archive_changed_in_storage_after_it_was_verified_is_never_served(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_last": -1}
    job, engine, base = start(owner, spec)
    earlier = upload(engine, base, 1, b"earlier weights")
    ckpt = upload(engine, base, 2, b"good weights")
    _, follower_engine, follower_base = start(owner, {**spec, "init_from": ckpt["id"]})
    served = owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download")
    assert served["X-Lab-Archive-SHA256"] == hashlib.sha256(b"good weights").hexdigest()
    stored = storage.path_of(Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).storage_key)
    stored.write_bytes(b"evil weights")  # the same size, other bytes

    init = follower_engine.get(f"{follower_base}/checkpoints/{ckpt['id']}/download")
    assert (init.status_code, init.json()["error"]["code"]) == (409, "checkpoint_corrupted")
    assert init.json()["error"]["message"] == (
        f"Checkpoint {ckpt['id']} failed verification: its stored archive no longer matches the SHA-256 "
        "recorded when it became ready; it is now failed."
    )
    public = owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download")
    assert (public.status_code, public.json()["error"]["code"]) == (409, "checkpoint_not_ready")
    assert follower_engine.get(f"{follower_base}/checkpoints/{ckpt['id']}/download").status_code == 404
    assert Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).status == "failed"
    assert not stored.exists()
    event = JobEvent.objects.get(job=job, type="checkpoint.failed")
    assert (event.level, event.data) == ("warning", {"checkpoint_id": ckpt["id"], "step": 2})
    assert event.message == (
        "Checkpoint of step 2 failed verification: its stored archive no longer matches the SHA-256 "
        f"recorded when it became ready ({hashlib.sha256(b'good weights').hexdigest()[:12]}…)."
    )
    assert owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["latest_checkpoint"]["id"] == earlier["id"]


def test_a_resume_from_an_archive_changed_in_storage_fails_the_launch_clearly(owner, spec, monkeypatch):
    from jobs.launchers import registry
    from jobs.pipeline import launch
    from jobs.models import JobAttempt
    from tests.support.fake_launcher import FakeLauncher

    launcher = FakeLauncher()
    monkeypatch.setattr(registry, "get_launcher", lambda: launcher)
    spec["checkpoints"] = {"interval": 1, "keep_last": -1}
    job, engine, base = start(owner, spec)
    earlier = upload(engine, base, 1, b"earlier weights")
    ckpt = upload(engine, base, 2, b"good weights")
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.FAILED, error_code="internal_error")
    storage.path_of(Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).storage_key).write_bytes(b"evil weights")
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, reason="waiting")
    attempt = job_claim_for_start(job_id=job.pk)
    assert attempt.resume_from.public_id == ckpt["id"]

    launch.attempt_launch(attempt_id=attempt.pk)

    assert launcher.requests == []
    job = Job.objects.unscoped().get(pk=job.pk)
    assert (job.status, job.error_code, job.error_message) == (
        JobStatus.FAILED,
        "internal_error",
        (
            f"Launch failed: Checkpoint {ckpt['id']} failed verification: its stored archive no longer matches the "
            "SHA-256 recorded when it became ready; it is now failed."
        ),
    )
    assert JobAttempt.objects.get(pk=attempt.pk).state == "ended"
    assert Checkpoint.objects.unscoped().get(public_id=ckpt["id"]).status == "failed"
    # Restarted, the job resumes from the checkpoint before, whose archive is intact.
    job_transition(job=job, to=JobStatus.QUEUED, reason="waiting")
    again = job_claim_for_start(job_id=job.pk)
    assert again.resume_from.public_id == earlier["id"]
    launch.attempt_launch(attempt_id=again.pk)
    assert [request.resume_archive for request in launcher.requests] == [
        storage.path_of(Checkpoint.objects.unscoped().get(public_id=earlier["id"]).storage_key)
    ]
