"""What only adapters do (the ADAPTER kind of jobs/artifacts/kinds.py): one per step, which a
newer attempt's export takes over, the detail route, the size limit, retention by default, the
spec section, the spool, S3 keys and the orphan sweep's keys. What adapters share with
checkpoints is in test_artifacts.py."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import storage
from jobs.artifacts.kinds import ADAPTER
from jobs.artifacts.lifecycle import sweep_orphans
from jobs.ingest.tokens import job_token
from jobs.models import Adapter, Job, JobEvent, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.support.artifacts import artifact_storage, start, upload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker", "commit_callbacks", artifact_storage.__name__)]


def statuses(job: Job) -> list[tuple[int, str]]:
    return list(Adapter.objects.unscoped().filter(job=job).order_by("step").values_list("step", "status"))


def test_another_organizations_adapters_are_404_as_missing_ones(owner, outsider, spec):
    job, engine, base = start(owner, spec)
    adapter = upload(engine, base, ADAPTER, 1, b"weights")
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


@pytest.mark.parametrize("adapters", [{"interval": 1, "keep_last": -1}, {"interval": 1}, None])
def test_retention_keeps_every_adapter_with_minus_one_or_by_default(owner, spec, adapters):
    if adapters is not None:
        spec["adapters"] = adapters
    job, engine, base = start(owner, spec)
    for step in (1, 2, 3):
        upload(engine, base, ADAPTER, step, f"step {step}".encode())
    assert statuses(job) == [(1, "ready"), (2, "ready"), (3, "ready")]


def test_a_newer_attempt_replaces_an_older_attempts_adapter_of_the_same_step(owner, spec):
    job, engine, base = start(owner, spec)
    first = upload(engine, base, ADAPTER, 2, b"attempt one")
    old_key = Adapter.objects.unscoped().get(public_id=first["id"]).storage_key
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, message="preempted")
    attempt = job_claim_for_start(job_id=job.pk)
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    second = upload(engine, base, ADAPTER, 2, b"attempt two", attempt=2)
    assert second["id"] == first["id"]
    row = Adapter.objects.unscoped().get(public_id=first["id"])
    assert (row.attempt, row.status, row.size_bytes) == (2, "ready", len(b"attempt two"))
    assert not storage.path_of(old_key).exists()
    answer = owner.client().get(f"/api/v1/adapters/{first['id']}/download")
    assert b"".join(answer.streaming_content) == b"attempt two"


def test_the_orphan_sweep_spares_adapters_and_fails_abandoned_uploads(owner, spec, settings):
    settings.LAB_ORPHAN_GRACE_S = 3600
    job, engine, base = start(owner, spec)
    kept = upload(engine, base, ADAPTER, 1, b"kept")
    kept_path = storage.path_of(Adapter.objects.unscoped().get(public_id=kept["id"]).storage_key)
    abandoned = engine.post(f"{base}/adapters", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    upload_path = Path(abandoned["upload"]["path"])
    upload_path.write_bytes(b"half")
    orphan = storage.path_of(f"{job.public_id}/adapters/adp_gone-a1.tar")
    orphan.write_bytes(b"left behind")
    two_hours_ago = time.time() - 7200
    for path in (kept_path, upload_path, orphan):
        os.utime(path, (two_hours_ago, two_hours_ago))
    assert sweep_orphans() == 1  # the attempt is still running: its upload stays
    assert kept_path.exists() and upload_path.exists() and not orphan.exists()
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.FAILED)
    sweep_orphans(now=timezone.now() + timedelta(hours=2))
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
    from engine.checkpoint_archives import write_tar
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
    ready = upload(engine, base, ADAPTER, 1, b"done")
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
    from engine.http_transport import HttpTransport

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


