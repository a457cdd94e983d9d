"""The lifecycle that checkpoints and adapters share (jobs/artifacts/), each test run for both
kinds: upload and verify, completion by the attempt that registered it only, download and the
check that a stored archive is unchanged, retention, the ready webhook, deleting a job, the
sweep of abandoned uploads, and hostile input. What only one kind does is in test_checkpoints.py
and test_adapters.py."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import storage
from jobs.artifacts.lifecycle import sweep_orphans
from jobs.models import Job, JobEvent
from lab.audit import Actor
from lab.formats import iso
from tests.support.artifacts import KIND, artifact_storage, complete, finish, next_attempt, register, start, upload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker", "commit_callbacks", artifact_storage.__name__)]


def statuses(kind, job: Job) -> list[tuple[int, str]]:
    return list(kind.model.objects.unscoped().filter(job=job).order_by("step").values_list("step", "status"))


@KIND
def test_a_ready_artifact_is_listed_and_streams_with_its_length_name_and_sha256(owner, spec, kind):
    job, engine, base = start(owner, spec)
    archive = b"tar bytes " * 1000
    ready = upload(engine, base, kind, 3, archive)
    assert ready["status"] == "ready"

    row = kind.model.objects.unscoped().get(public_id=ready["id"])
    assert owner.client().get(f"/api/v1/jobs/{job.public_id}/{kind.name}s").json()["data"] == [{
        "id": ready["id"], "object": kind.name, "job_id": job.public_id, "step": 3, "attempt": 1,
        "status": "ready", "format": "peft-lora", "size_bytes": len(archive),
        "sha256": hashlib.sha256(archive).hexdigest(), "created_at": iso(row.created_at),
    }]
    answer = owner.client().get(f"/api/v1/{kind.name}s/{ready['id']}/download", HTTP_ACCEPT="application/x-tar")
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == archive
    assert answer["Content-Length"] == str(len(archive))
    assert answer["Content-Type"] == "application/x-tar"
    assert answer["Content-Disposition"] == f'attachment; filename="{job.public_id}-step-000003-{ready["id"]}.tar"'
    assert answer["X-Lab-Archive-SHA256"] == hashlib.sha256(archive).hexdigest()
    events = JobEvent.objects.filter(job=job, type=f"{kind.name}.ready")
    assert list(events.values_list("message", "data")) == [
        (f"{kind.title} of step 3 is ready.", {kind.id_field: ready["id"], "step": 3})
    ]


@KIND
def test_another_organizations_artifact_is_404_as_a_missing_one(owner, outsider, spec, kind):
    job, engine, base = start(owner, spec)
    mine = upload(engine, base, kind, 1, b"mine")
    for path in (f"/api/v1/jobs/{job.public_id}/{kind.name}s", f"/api/v1/{kind.name}s/{mine['id']}/download"):
        foreign = outsider.client().get(path)
        missing = outsider.client().get(path.replace(job.public_id, "job_missing").replace(mine["id"], "x_missing"))
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json()["error"] == missing.json()["error"]
    assert kind.model.objects.unscoped().get(public_id=mine["id"]).status == "ready"


@KIND
def test_a_tampered_upload_fails_is_not_downloadable_and_its_objects_go(owner, spec, kind):
    job, engine, base = start(owner, spec)
    registered = register(engine, base, kind, 3)
    path = Path(registered["upload"]["path"])
    path.write_bytes(b"tampered weights")  # the size claimed, other bytes
    answer = complete(engine, base, kind, registered["id"], b"original weights")
    assert answer.json() == {"id": registered["id"], "status": "failed"}
    row = kind.model.objects.unscoped().get(public_id=registered["id"])
    assert (row.status, row.size_bytes, row.sha256) == ("failed", None, "")
    assert not path.exists() and not storage.path_of(row.storage_key).exists()
    event = JobEvent.objects.get(job=job, type=f"{kind.name}.failed")
    assert (event.level, event.data) == ("warning", {kind.id_field: registered["id"], "step": 3})
    assert not JobEvent.objects.filter(job=job, type=f"{kind.name}.ready").exists()
    download = owner.client().get(f"/api/v1/{kind.name}s/{registered['id']}/download")
    assert (download.status_code, download.json()["error"]["code"]) == (409, f"{kind.name}_not_ready")
    again = complete(engine, base, kind, registered["id"], b"original weights")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "invalid_state")


@KIND
def test_a_size_that_differs_fails_without_hashing_and_says_what_was_found(owner, spec, kind):
    job, engine, base = start(owner, spec)
    short = register(engine, base, kind, 2)
    Path(short["upload"]["path"]).write_bytes(b"short")
    assert complete(engine, base, kind, short["id"], b"short!").json() == {"id": short["id"], "status": "failed"}
    nothing = register(engine, base, kind, 3)
    complete(engine, base, kind, nothing["id"], b"absent")
    messages = JobEvent.objects.filter(job=job, type=f"{kind.name}.failed").order_by("id").values_list("message", flat=True)
    assert list(messages) == [
        f"{kind.title} of step 2 failed verification: found 5 bytes, not the 6 reported.",
        f"{kind.title} of step 3 failed verification: found nothing.",
    ]


@KIND
def test_an_uploading_artifact_is_not_downloadable(owner, spec, kind):
    _, engine, base = start(owner, spec)
    uploading = register(engine, base, kind, 1)
    answer = owner.client().get(f"/api/v1/{kind.name}s/{uploading['id']}/download")
    assert (answer.status_code, answer.json()["error"]["code"]) == (409, f"{kind.name}_not_ready")
    assert "uploading" in answer.json()["error"]["message"]


@KIND
def test_completing_a_ready_artifact_again_changes_nothing(owner, spec, kind):
    job, engine, base = start(owner, spec)
    ready = upload(engine, base, kind, 1, b"weights")
    before = kind.model.objects.unscoped().get(public_id=ready["id"])
    again = complete(engine, base, kind, ready["id"], b"other bytes")
    assert again.json() == {"id": ready["id"], "status": "ready"}
    after = kind.model.objects.unscoped().get(public_id=ready["id"])
    assert (after.status, after.size_bytes, after.sha256, after.ready_at) == (
        before.status, before.size_bytes, before.sha256, before.ready_at
    )
    assert JobEvent.objects.filter(job=job, type=f"{kind.name}.ready").count() == 1


@KIND
def test_an_upload_arriving_after_the_artifact_is_ready_goes_with_the_next_completion(owner, spec, kind):
    # An exited engine's spool, delivered by Lab while the engine's own completion was sealing the
    # same artifact, stores the archive again at the upload key and completes a ready one.
    job, engine, base = start(owner, spec)
    ready = upload(engine, base, kind, 1, b"weights")
    key = kind.model.objects.unscoped().get(public_id=ready["id"]).storage_key
    storage.path_of(storage.upload_key(key)).write_bytes(b"weights")
    assert complete(engine, base, kind, ready["id"], b"weights").json() == {"id": ready["id"], "status": "ready"}
    assert not storage.path_of(storage.upload_key(key)).exists()
    assert storage.path_of(key).read_bytes() == b"weights"
    assert JobEvent.objects.filter(job=job, type=f"{kind.name}.ready").count() == 1


@KIND
def test_another_jobs_engine_cannot_complete_or_register_for_a_job(owner, spec, kind):
    job, engine, base = start(owner, spec)
    other, other_engine, other_base = start(owner, spec)
    registered = register(engine, base, kind, 1)
    Path(registered["upload"]["path"]).write_bytes(b"a")
    foreign = complete(other_engine, other_base, kind, registered["id"], b"a")
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (404, "not_found")
    wrong_job = other_engine.post(f"{base}/{kind.name}s", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json")
    assert wrong_job.status_code == 401
    assert statuses(kind, job) == [(1, "uploading")] and statuses(kind, other) == []


@KIND
@pytest.mark.parametrize("bad_id", ["x" * 300, "ckpt_unknown", "adp_unknown", "..%2F..%2Fx"])
def test_completing_an_unknown_or_malformed_id_is_a_404(owner, spec, kind, bad_id):
    _, engine, base = start(owner, spec)
    answer = engine.post(f"{base}/{kind.name}s/{bad_id}/complete", {"size_bytes": 1, "sha256": "0" * 64}, format="json")
    assert (answer.status_code, answer.json()["error"]["code"]) == (404, "not_found")


@KIND
@pytest.mark.parametrize(
    "body",
    [{}, {"size_bytes": -1, "sha256": "0" * 64}, {"size_bytes": 1, "sha256": "xyz"}, {"size_bytes": 1, "sha256": "ABC"},
     {"size_bytes": "many", "sha256": "0" * 64}],
)
def test_a_malformed_completion_is_refused_and_changes_nothing(owner, spec, kind, body):
    job, engine, base = start(owner, spec)
    registered = register(engine, base, kind, 1)
    Path(registered["upload"]["path"]).write_bytes(b"x")
    answer = engine.post(f"{base}/{kind.name}s/{registered['id']}/complete", body, format="json")
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request")
    assert statuses(kind, job) == [(1, "uploading")]
    assert Path(registered["upload"]["path"]).read_bytes() == b"x"


@KIND
@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"attempt": 1, "step": 4, "format": "peft-lora"}, 409, "invalid_step", "step"),  # max_steps is 3
        ({"attempt": 1, "step": 999999, "format": "peft-lora"}, 409, "invalid_step", "step"),
        ({"attempt": 1, "step": -1, "format": "peft-lora"}, 400, "invalid_request", "step"),
        ({"attempt": 1, "step": 1.5, "format": "peft-lora"}, 400, "invalid_request", "step"),
        ({"attempt": 1, "format": "peft-lora"}, 400, "invalid_request", "step"),
        ({"attempt": 1, "step": 1, "format": "pickle"}, 400, "invalid_request", "format"),
        ({"attempt": 2, "step": 1, "format": "peft-lora"}, 400, "invalid_request", "attempt"),
        ({"attempt": "one", "step": 1, "format": "peft-lora"}, 400, "invalid_request", "attempt"),
        ({"attempt": 1, "step": 1, "format": "peft-lora", "path": "/etc/passwd"}, 400, "invalid_request", "path"),
    ],
)
def test_a_hostile_registration_is_refused_and_creates_nothing(owner, spec, kind, body, status, code, param):
    job, engine, base = start(owner, spec)
    answer = engine.post(f"{base}/{kind.name}s", body, format="json")
    assert answer.status_code == status, answer.content
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == (code, param)
    assert not kind.model.objects.unscoped().filter(job=job).exists()
    assert list(storage.iter_objects()) == []


@KIND
def test_a_job_that_ended_takes_no_new_artifact(owner, spec, kind):
    job, engine, base = start(owner, spec)  # max_steps 3
    real = upload(engine, base, kind, 3, b"real weights")
    beyond = engine.post(f"{base}/{kind.name}s", {"attempt": 1, "step": 4, "format": "peft-lora"}, format="json")
    assert (beyond.status_code, beyond.json()["error"]["code"], beyond.json()["error"]["message"]) == (
        409, "invalid_step", f"{kind.name} for step 4: this job has 3 steps."
    )
    finish(job)
    for step in (999999, 3, 2):
        late = engine.post(f"{base}/{kind.name}s", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json")
        assert late.json()["error"] == {
            "type": "conflict_error", "code": "invalid_state", "param": None, "errors": [],
            "message": f"This job has ended (succeeded): it takes no new {kind.name}s.",
        }
    assert list(kind.model.objects.unscoped().filter(job=job).values_list("public_id", "status")) == [(real["id"], "ready")]
    assert [key for key, _ in storage.iter_objects()] == [kind.model.objects.unscoped().get().storage_key]


@KIND
def test_only_the_current_attempt_that_registered_an_artifact_completes_it(owner, spec, kind):
    job, first, base = start(owner, spec)
    own = register(first, base, kind, 1)
    Path(own["upload"]["path"]).write_bytes(b"attempt one")
    second = next_attempt(job)
    newer = register(second, base, kind, 2, attempt=2)
    Path(newer["upload"]["path"]).write_bytes(b"attempt two")
    contents = {own["id"]: b"attempt one", newer["id"]: b"attempt two"}

    # The superseded attempt completes neither the newer attempt's upload nor its own; the newer
    # attempt does not complete the older one's.
    for engine, artifact_id in ((first, newer["id"]), (first, own["id"]), (second, own["id"])):
        late = complete(engine, base, kind, artifact_id, contents[artifact_id])
        error = late.json()["error"]
        assert (late.status_code, error["code"], error["param"]) == (409, "stale_attempt", "attempt"), artifact_id
    assert statuses(kind, job) == [(1, "uploading"), (2, "uploading")]
    assert Path(newer["upload"]["path"]).read_bytes() == b"attempt two"  # nothing sealed
    done = complete(second, base, kind, newer["id"], b"attempt two")
    assert done.json() == {"id": newer["id"], "status": "ready"}


@KIND
def test_an_archive_changed_in_storage_is_failed_instead_of_served(owner, spec, kind):
    job, engine, base = start(owner, spec)
    ready = upload(engine, base, kind, 2, b"good weights")
    stored = storage.path_of(kind.model.objects.unscoped().get(public_id=ready["id"]).storage_key)
    stored.write_bytes(b"evil weights")  # the same size, other bytes

    answer = owner.client().get(f"/api/v1/{kind.name}s/{ready['id']}/download")

    assert (answer.status_code, answer.json()["error"]["code"]) == (409, f"{kind.name}_corrupted")
    assert answer.json()["error"]["message"] == (
        f"{kind.title} {ready['id']} failed verification: its stored archive no longer matches the SHA-256 "
        "recorded when it became ready; it is now failed."
    )
    assert statuses(kind, job) == [(2, "failed")] and not stored.exists()
    event = JobEvent.objects.get(job=job, type=f"{kind.name}.failed")
    assert (event.level, event.data) == ("warning", {kind.id_field: ready["id"], "step": 2})
    assert event.message == (
        f"{kind.title} of step 2 failed verification: its stored archive no longer matches the SHA-256 "
        f"recorded when it became ready ({hashlib.sha256(b'good weights').hexdigest()[:12]}…)."
    )
    again = owner.client().get(f"/api/v1/{kind.name}s/{ready['id']}/download")
    assert (again.status_code, again.json()["error"]["code"]) == (409, f"{kind.name}_not_ready")


@KIND
def test_retention_keeps_the_newest_keep_last(owner, spec, kind):
    spec[kind.retention] = {"interval": 1, "keep_last": 2}
    job, engine, base = start(owner, spec)
    ids = [upload(engine, base, kind, step, f"step {step}".encode())["id"] for step in (1, 2, 3)]
    assert statuses(kind, job) == [(1, "deleted"), (2, "ready"), (3, "ready")]
    assert sorted(key for key, _ in storage.iter_objects()) == sorted(
        kind.model.objects.unscoped().get(public_id=artifact_id).storage_key for artifact_id in ids[1:]
    )
    listed = owner.client().get(f"/api/v1/jobs/{job.public_id}/{kind.name}s").json()["data"]
    assert [(row["id"], row["status"]) for row in listed if row["id"] == ids[0]] == [(ids[0], "deleted")]
    download = owner.client().get(f"/api/v1/{kind.name}s/{ids[0]}/download")
    assert (download.status_code, download.json()["error"]["code"]) == (409, f"{kind.name}_not_ready")


@KIND
def test_retention_keeps_every_artifact_with_minus_one(owner, spec, kind):
    spec[kind.retention] = {"interval": 1, "keep_last": -1}
    job, engine, base = start(owner, spec)
    for step in (1, 2, 3):
        upload(engine, base, kind, step, f"step {step}".encode())
    assert statuses(kind, job) == [(1, "ready"), (2, "ready"), (3, "ready")]


@KIND
def test_the_ready_webhook_links_to_the_download(owner, spec, settings, kind):
    from jobs.webhooks.endpoints import endpoint_create
    from jobs.webhooks.models import WebhookMessage

    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    endpoint_create(
        project=owner.project, actor=Actor(user=owner.user),
        data={"url": "http://127.0.0.1:9/hook", "events": [f"{kind.name}.ready"]},
    )
    job, engine, base = start(owner, spec)
    upload(engine, base, kind, 1, b"bad", claimed=b"other")  # a failed upload sends nothing
    ready = upload(engine, base, kind, 3, b"weights")
    messages = list(WebhookMessage.objects.filter(project=owner.project).values_list("type", "body"))
    assert [type for type, _ in messages] == [f"{kind.name}.ready"]
    data = json.loads(messages[0][1])["data"]
    assert data == {
        "job_id": job.public_id,
        kind.id_field: ready["id"],
        "step": 3,
        "download_url": f"{settings.LAB_PUBLIC_URL}/api/v1/{kind.name}s/{ready['id']}/download",
    }
    answer = owner.client().get(data["download_url"].removeprefix(settings.LAB_PUBLIC_URL))
    assert b"".join(answer.streaming_content) == b"weights"


@KIND
def test_deleting_a_job_deletes_its_archives(owner, spec, kind):
    job, engine, base = start(owner, spec)
    ready = upload(engine, base, kind, 1, b"weights")
    path = storage.path_of(kind.model.objects.unscoped().get(public_id=ready["id"]).storage_key)
    assert path.exists()
    finish(job)
    assert owner.client().delete(f"/api/v1/jobs/{job.public_id}").status_code == 204
    assert not path.exists()
    assert not kind.model.objects.unscoped().filter(public_id=ready["id"]).exists()
    assert owner.client().get(f"/api/v1/{kind.name}s/{ready['id']}/download").status_code == 404


@KIND
def test_the_sweep_fails_uploads_that_their_attempt_abandoned(owner, spec, settings, kind):
    settings.LAB_ORPHAN_GRACE_S = 3600
    ended, ended_engine, ended_base = start(owner, spec)
    abandoned = register(ended_engine, ended_base, kind, 1)
    Path(abandoned["upload"]["path"]).write_bytes(b"half an upl")
    running, running_engine, running_base = start(owner, spec)
    in_progress = register(running_engine, running_base, kind, 1)
    Path(in_progress["upload"]["path"]).write_bytes(b"still going")
    finish(ended)
    assert sweep_orphans() == 0  # inside the grace period nothing changes
    assert statuses(kind, ended) == [(1, "uploading")]

    later = timezone.now() + timedelta(hours=2)
    sweep_orphans(now=later)
    assert statuses(kind, ended) == [(1, "failed")]
    assert not Path(abandoned["upload"]["path"]).exists()
    event = JobEvent.objects.get(job=ended, type=f"{kind.name}.failed")
    assert event.message == f"{kind.title} of step 1 failed: attempt 1 ended before completing its upload."
    # The running attempt may still complete its upload.
    assert statuses(kind, running) == [(1, "uploading")]
    assert Path(in_progress["upload"]["path"]).exists()
    sweep_orphans(now=later)
    assert JobEvent.objects.filter(type=f"{kind.name}.failed").count() == 1


@KIND
def test_the_list_pages_newest_first_with_limit_and_after(owner, spec, kind):
    job, engine, base = start(owner, spec)
    ids = [upload(engine, base, kind, step, f"step {step}".encode())["id"] for step in (1, 2, 3)]
    route = f"/api/v1/jobs/{job.public_id}/{kind.name}s"
    first = owner.client().get(route, {"limit": 2}).json()
    assert ([row["id"] for row in first["data"]], first["has_more"]) == ([ids[2], ids[1]], True)
    rest = owner.client().get(route, {"limit": 2, "after": ids[1]}).json()
    assert ([row["id"] for row in rest["data"]], rest["has_more"]) == ([ids[0]], False)
    assert owner.client().get(route, {"limit": 1000}).status_code == 400
