"""The checkpoint lifecycle on S3 (``LAB_STORAGE_URL=s3://...``), against a real moto server
process: pre-signed PUT uploads by the engine's uploader, verification, signed download
redirects, retention, deleting a job, and the orphan sweep."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from engine.http_transport import HttpTransport
from engine.reporter import IngestError
from jobs import storage
from jobs.artifacts.lifecycle import sweep_orphans
from jobs.ingest.tokens import job_token
from jobs.models import Checkpoint, Job, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker", "commit_callbacks")]

PREFIX = "lab/checkpoints"


def start(tenant, spec) -> tuple[Job, APIClient, str, str]:
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    token = job_token(attempt)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return Job.objects.unscoped().get(pk=job.pk), engine, f"/api/v1/ingest/jobs/{job.public_id}", token


def upload(engine, base, job, token, step: int, content: bytes, tmp_path: Path, *, claimed: bytes | None = None) -> dict:
    """Register, PUT ``content`` through the engine's own uploader, complete; return the answers."""
    registered = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json")
    assert registered.status_code == 201, registered.content
    body = registered.json()
    archive = tmp_path / f"step-{step}.tar"
    archive.write_bytes(content)
    HttpTransport("http://127.0.0.1:9", job.public_id, token).upload(body["upload"], archive)
    claimed = content if claimed is None else claimed
    completed = engine.post(
        f"{base}/checkpoints/{body['id']}/complete",
        {"size_bytes": len(claimed), "sha256": hashlib.sha256(claimed).hexdigest()},
        format="json",
    )
    return {**body, "status": completed.json()["status"]}


def test_register_answers_a_presigned_put_that_the_engine_uploads_to(owner, spec, s3_server, bucket, tmp_path):
    job, engine, base, token = start(owner, spec)
    ckpt = upload(engine, base, job, token, 2, b"lora weights" * 100, tmp_path)
    target = ckpt["upload"]
    assert target["method"] == "put"
    assert target["headers"] == {"Content-Type": "application/x-tar"}
    url = urlsplit(target["url"])
    assert f"{url.scheme}://{url.netloc}" == s3_server.endpoint_url
    assert url.path == f"/{bucket}/{PREFIX}/{job.public_id}/{ckpt['id']}.upload.tar"  # sealed into .tar by Lab
    assert "X-Amz-Signature" in parse_qs(url.query)
    assert ckpt["status"] == "ready"
    checkpoint = Checkpoint.objects.unscoped().get(public_id=ckpt["id"])
    assert checkpoint.size_bytes == 1200
    assert checkpoint.sha256 == hashlib.sha256(b"lora weights" * 100).hexdigest()
    assert s3_server.keys(bucket) == [f"{PREFIX}/{job.public_id}/{ckpt['id']}.tar"]


def test_a_put_to_the_upload_url_after_sealing_changes_nothing_lab_serves(owner, spec, s3_server, bucket, tmp_path):
    job, engine, base, token = start(owner, spec)
    archive = b"verified" * 64
    ckpt = upload(engine, base, job, token, 2, archive, tmp_path)
    assert ckpt["status"] == "ready"
    again = tmp_path / "again.tar"
    again.write_bytes(b"replaced after completion")
    HttpTransport("http://127.0.0.1:9", job.public_id, token).upload(ckpt["upload"], again)  # the URL still signs
    key = f"{job.public_id}/{ckpt['id']}.tar"
    assert storage.stored_size_and_sha256(key) == (len(archive), hashlib.sha256(archive).hexdigest())


def test_a_tampered_or_missing_upload_fails_and_leaves_nothing_stored(owner, spec, s3_server, bucket, tmp_path):
    job, engine, base, token = start(owner, spec)
    tampered = upload(engine, base, job, token, 1, b"tampered", tmp_path, claimed=b"original")
    assert tampered["status"] == "failed"
    never_uploaded = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    missing = engine.post(
        f"{base}/checkpoints/{never_uploaded['id']}/complete", {"size_bytes": 1, "sha256": "0" * 64}, format="json"
    )
    assert missing.json()["status"] == "failed"
    assert s3_server.keys(bucket) == []
    assert list(Checkpoint.objects.unscoped().filter(job=job).values_list("status", flat=True)) == ["failed", "failed"]


def test_an_upload_refused_by_storage_is_an_error_for_the_engine(owner, spec, bucket, tmp_path):
    job, engine, base, token = start(owner, spec)
    body = engine.post(f"{base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json").json()
    gone = {**body["upload"], "url": body["upload"]["url"].replace(f"/{bucket}/", "/no-such-bucket/")}
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"x")
    with pytest.raises(IngestError) as raised:
        HttpTransport("http://127.0.0.1:9", job.public_id, token).upload(gone, archive)
    assert raised.value.status_code == 404
    assert raised.value.retryable is False


def test_download_redirects_to_a_short_lived_signed_get(owner, outsider, spec, bucket, tmp_path):
    job, engine, base, token = start(owner, spec)
    content = b"archive bytes" * 50
    ckpt = upload(engine, base, job, token, 3, content, tmp_path)
    answer = owner.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download")
    assert answer.status_code == 302
    assert answer["Cache-Control"] == "no-store"
    # Lab does not read the object again here: the receiver checks what it fetches against this.
    assert answer["X-Lab-Archive-SHA256"] == hashlib.sha256(content).hexdigest()
    location = answer["Location"]
    query = parse_qs(urlsplit(location).query)
    assert query["X-Amz-Expires"] == ["300"]
    fetched = httpx.get(location)
    assert fetched.status_code == 200
    assert fetched.content == content
    assert fetched.headers["content-disposition"] == f'attachment; filename="{job.public_id}-step-000003-{ckpt["id"]}.tar"'
    assert outsider.client().get(f"/api/v1/checkpoints/{ckpt['id']}/download").status_code == 404


def test_retention_and_job_deletion_remove_the_objects(owner, spec, s3_server, bucket, tmp_path):
    spec["checkpoints"] = {"interval": 1, "keep_last": 1}
    job, engine, base, token = start(owner, spec)
    first = upload(engine, base, job, token, 1, b"one", tmp_path)
    second = upload(engine, base, job, token, 2, b"two", tmp_path)
    assert s3_server.keys(bucket) == [f"{PREFIX}/{job.public_id}/{second['id']}.tar"]
    assert Checkpoint.objects.unscoped().get(public_id=first["id"]).status == "deleted"  # listed, no object
    other, other_engine, other_base, other_token = start(owner, spec)
    kept = upload(other_engine, other_base, other, other_token, 1, b"other job", tmp_path)
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    assert owner.client().delete(f"/api/v1/jobs/{job.public_id}").status_code == 204
    assert s3_server.keys(bucket) == [f"{PREFIX}/{other.public_id}/{kept['id']}.tar"]


def test_the_orphan_sweep_on_s3_spares_rows_and_young_objects(owner, spec, s3_server, bucket, tmp_path, settings):
    settings.LAB_ORPHAN_GRACE_S = 3600
    job, engine, base, token = start(owner, spec)
    kept = upload(engine, base, job, token, 1, b"kept", tmp_path)
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/{job.public_id}/ckpt_orphan.tar", Body=b"orphan")
    client.put_object(Bucket=bucket, Key="outside-the-prefix.tar", Body=b"not ours")
    assert sweep_orphans() == 0  # everything is younger than the grace period
    later = timezone.now() + timedelta(hours=2)
    assert sweep_orphans(now=later) == 1
    assert s3_server.keys(bucket) == sorted([f"{PREFIX}/{job.public_id}/{kept['id']}.tar", "outside-the-prefix.tar"])
    assert sweep_orphans(now=later) == 0
    assert storage.stored_size_and_sha256(f"{job.public_id}/{kept['id']}.tar") == (4, hashlib.sha256(b"kept").hexdigest())
