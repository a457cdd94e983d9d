"""What only checkpoints do, on the filesystem backend (jobs/checkpoints.py): the engine's own
download of the checkpoint it starts from, resuming, retention that spares a checkpoint another
job starts from, the live stream of their changes, the orphan sweep's beat task, and the storage
setting. What checkpoints share with adapters is in test_artifacts.py."""

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

from environments.storage import KEY_PREFIX as ENVIRONMENT_KEY_PREFIX
from jobs import storage
from jobs.artifacts.kinds import CHECKPOINT
from jobs.artifacts.lifecycle import sweep_orphans
from jobs.models import Checkpoint, Job, JobEvent, JobStatus
from jobs.registry.store import KEY_PREFIX as MODEL_KEY_PREFIX
from jobs.services import job_claim_for_start, job_submit, job_transition
from jobs.tasks import sweep_orphan_checkpoints
from lab import storage as objects
from lab.audit import Actor
from sandboxes.kept_logs import KEY_PREFIX as SANDBOX_LOG_KEY_PREFIX
from tests.support.artifacts import artifact_storage, start, upload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker", "commit_callbacks", artifact_storage.__name__)]


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


@pytest.mark.parametrize("bad_id", ["ckpt_" + "x" * 200, "..%2F..%2Fsecret_key", "job_abc", "%20", "ckpt_%E2%9C%93"])
def test_it_answers_404_for_malformed_checkpoint_ids(owner, bad_id):
    answer = owner.client().get(f"/api/v1/checkpoints/{bad_id}/download")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


def test_it_answers_400_for_a_nul_in_a_checkpoint_id(owner):
    answer = owner.client().get("/api/v1/checkpoints/ckpt_%00/download")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"


def test_retention_keeps_every_checkpoint_with_primes_keep_cloud_minus_one(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_cloud": -1}
    spec["max_steps"] = 3
    job, engine, base = start(owner, spec)
    assert job.spec["checkpoints"] == {"interval": 1, "keep_last": -1}
    for step in (1, 2, 3):
        upload(engine, base, CHECKPOINT, step, f"step {step}".encode())
    assert list(Checkpoint.objects.unscoped().filter(job=job).values_list("status", flat=True)) == ["ready"] * 3


def test_a_deleted_checkpoint_stays_listed_without_a_download_and_its_removal_is_streamed(owner, spec):
    from jobs.stream.records import read_after

    spec["checkpoints"] = {"interval": 1, "keep_last": 1}
    job, engine, base = start(owner, spec)
    first = upload(engine, base, CHECKPOINT, 1, b"first")["id"]
    upload(engine, base, CHECKPOINT, 2, b"second")
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
    first = upload(engine, base, CHECKPOINT, 1, b"first")["id"]
    follower = job_submit(project=owner.project, actor=Actor(user=owner.user), data={**spec, "init_from": first})
    assert follower.status == JobStatus.QUEUED
    second = upload(engine, base, CHECKPOINT, 2, b"second")["id"]
    ready = Checkpoint.objects.unscoped().filter(job=source, status="ready")
    assert set(ready.values_list("public_id", flat=True)) == {first, second}
    third = upload(engine, base, CHECKPOINT, 3, b"third")["id"]
    # The follower still needs the first; the second is neither newest nor needed.
    assert set(ready.values_list("public_id", flat=True)) == {first, third}
    assert Checkpoint.objects.unscoped().get(public_id=second).status == "deleted"


def test_the_orphan_sweep_removes_old_objects_without_a_row_and_spares_young_ones(owner, spec, settings):
    settings.LAB_ORPHAN_GRACE_S = 3600
    job, engine, base = start(owner, spec)
    kept = upload(engine, base, CHECKPOINT, 1, b"kept")
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
    assert sweep_orphans() == 0  # idempotent
    # Past its grace period the abandoned upload goes too.
    assert sweep_orphans(now=timezone.now() + timedelta(hours=2)) == 1
    assert not young_orphan.exists()
    assert kept_path.exists()


def test_every_other_kind_of_object_lives_under_a_prefix_the_sweep_leaves_alone():
    owned = tuple(objects.OWNED_PREFIXES)
    assert all(prefix.startswith(owned) for prefix in (ENVIRONMENT_KEY_PREFIX, MODEL_KEY_PREFIX, SANDBOX_LOG_KEY_PREFIX))
    assert not any(key.startswith(owned) for key in (storage.checkpoint_key("job_abc", "ckpt_def"), "job_abc/x.tar.partial"))


def test_an_engine_downloads_its_init_checkpoint_but_no_other(owner, outsider, spec):
    _, engine, base = start(owner, spec)
    init = upload(engine, base, CHECKPOINT, 1, b"init weights")["id"]
    _, unrelated_engine, unrelated_base = start(owner, spec)
    unrelated = upload(unrelated_engine, unrelated_base, CHECKPOINT, 1, b"other")["id"]
    _, foreign_engine, foreign_base = start(outsider, spec)
    foreign = upload(foreign_engine, foreign_base, CHECKPOINT, 1, b"foreign")["id"]
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
    ckpt = upload(engine, base, CHECKPOINT, 1, b"bytes")
    for accept in ("application/x-tar", "*/*", "text/html", "application/json"):
        answer = owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download", HTTP_ACCEPT=accept)
        assert answer.status_code == 200, accept
    refused = owner.client().get("/api/v1/checkpoints/ckpt_missing/download", HTTP_ACCEPT="application/x-tar")
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "not_found"


def test_a_read_only_key_downloads(owner, spec):
    from lab.services import api_key_create

    _, engine, base = start(owner, spec)
    ckpt = upload(engine, base, CHECKPOINT, 1, b"bytes")
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    assert owner.client(key).get(f"/api/v1/checkpoints/{ckpt['id']}/download").status_code == 200


def test_an_archive_changed_in_storage_after_it_was_verified_is_never_served(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_last": -1}
    job, engine, base = start(owner, spec)
    earlier = upload(engine, base, CHECKPOINT, 1, b"earlier weights")
    ckpt = upload(engine, base, CHECKPOINT, 2, b"good weights")
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
    from jobs.models import JobAttempt
    from jobs.pipeline import launch
    from tests.support.fake_launcher import FakeLauncher

    launcher = FakeLauncher()
    monkeypatch.setattr(registry, "get_launcher", lambda: launcher)
    spec["checkpoints"] = {"interval": 1, "keep_last": -1}
    job, engine, base = start(owner, spec)
    earlier = upload(engine, base, CHECKPOINT, 1, b"earlier weights")
    ckpt = upload(engine, base, CHECKPOINT, 2, b"good weights")
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
