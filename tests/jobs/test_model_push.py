"""An organization brings its own model (``POST /api/v1/models``): the web process only stores the
archive; a worker's check (``jobs.registry.builds``, run here as the task would) unpacks it in
bubblewrap, checks it and stores its files; the model is then the organization's alone, another
organization getting exactly what a missing model gets, on every route."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from evaluations.models import Evaluation
from jobs.models import Job, Model, ModelBuild
from jobs.registry import builds
from jobs.registry.builds import build_run, build_sweep
from jobs.registry.store import launch_model
from lab import storage
from lab.audit import Actor
from lab.celery import TaskName
from lab.models import AuditLogEntry
from lab.services import api_key_create
from serving.models import Deployment
from tests.support.evaluations import evaluation_body
from tests.support.model_dirs import (
    model_storage,  # noqa: F401  (a fixture: an empty model store)
    tar_directory,
    tiny_model_directory,
)
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("model_storage")]

MODEL_ID = "acme/my-model"


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    """Archives of the tiny Qwen3: a good one (gzip'd, in a folder), a second version with other
    weights, one holding a pickle, one holding a link to a file of the host."""
    root = tmp_path_factory.mktemp("archives")
    model = tiny_model_directory(root / "model")
    other = tiny_model_directory(root / "other", seed=1)
    pickled = tiny_model_directory(root / "pickled")
    (pickled / "optimizer.pt").write_bytes(b"\x80\x04pickle")
    linked = root / "linked.tar"
    with tarfile.open(linked, "w") as tar:
        for path in sorted(model.iterdir()):
            tar.add(path, arcname=path.name)
        info = tarfile.TarInfo("vocab.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    return {
        "good": tar_directory(model, root / "good.tar.gz", top="my-model", gzip=True),
        "other": tar_directory(other, root / "other.tar"),
        "pickled": tar_directory(pickled, root / "pickled.tar"),
        "linked": linked,
    }


def push(client, archive: Path, name: str = MODEL_ID):
    with archive.open("rb") as handle:
        return client.post("/api/v1/models", {"name": name, "file": handle}, format="multipart")


def test_a_pushed_model_is_checked_by_a_worker_then_trains_for_its_organization_only(archives, owner, outsider, spec, monkeypatch):
    sent = []
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda name, *ids: sent.append((name, *ids)))
    answer = push(owner.client(), archives["good"])
    assert answer.status_code == 201, answer.content
    pushed = answer.json()
    build = ModelBuild.objects.unscoped().get()
    assert sent == [(TaskName.CHECK_MODEL, build.pk)]
    assert (pushed["id"], pushed["status"], pushed["owned_by"], pushed["source"]) == (MODEL_ID, "checking", "acme", "push")
    assert {key: pushed["build"][key] for key in ("number", "status", "error", "revision", "archive_size_bytes")} == {
        "number": 1, "status": "queued", "error": None, "revision": None, "archive_size_bytes": archives["good"].stat().st_size,
    }
    refused = owner.client().post("/api/v1/jobs", dict(spec, model=MODEL_ID), format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["errors"][0] == {
        "param": "model", "code": "model_not_ready",
        "message": f"model '{MODEL_ID}' is not ready to train: its check 1 is queued (see `lab models get {MODEL_ID}`)",
    }
    assert AuditLogEntry.objects.filter(action="model.push", target=MODEL_ID).count() == 1

    assert build_run(build.pk).status == "ready"
    assert build_run(build.pk) is None  # a second delivery of the task does nothing
    model = Model.objects.get(id=MODEL_ID)
    assert (model.status, model.architecture, model.parameters, model.context_length) == ("ready", "qwen3", 80_576, 512)
    assert [file["path"] for file in model.files] == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]
    assert not storage.object_storage().exists(build.archive_key)  # the upload goes once checked
    detail = owner.client().get(f"/api/v1/models/{MODEL_ID}").json()
    assert (detail["status"], detail["build"]["status"], detail["build"]["revision"]) == ("ready", "ready", model.revision)
    document = served_document()
    assert_matches(document, "Model", pushed)
    assert_matches(document, "Model", detail)
    assert_matches(document, "ModelList", owner.client().get("/api/v1/models").json())
    log = owner.client().get(f"/api/v1/models/{MODEL_ID}/build-log").content.decode()
    assert "config.json: a qwen3 of 80,576 parameters" in log and log.endswith("check 1: passed\n")
    assert owner.client().post("/api/v1/jobs", dict(spec, model=MODEL_ID), format="json").status_code == 201
    assert launch_model(model_id=MODEL_ID, organization_id=owner.organization.pk)["revision"] == model.revision

    theirs = outsider.client()
    assert MODEL_ID not in {item["id"] for item in theirs.get("/api/v1/models").json()["data"]}
    for route in ("", "/build-log", "/archive"):
        answers = [theirs.get(f"/api/v1/models/{model_id}{route}") for model_id in (MODEL_ID, "acme/no-such-model")]
        assert [answer.status_code for answer in answers] == [404, 404] and answers[0].content == answers[1].content
    private = theirs.post("/api/v1/jobs", dict(spec, model=MODEL_ID), format="json")
    missing = theirs.post("/api/v1/jobs", dict(spec, model="acme/no-such-model"), format="json")
    assert private.json()["error"]["errors"][0]["code"] == "unknown_model"
    assert private.content.decode().replace(MODEL_ID, "ID") == missing.content.decode().replace("acme/no-such-model", "ID")
    # Another organization cannot push into this one's names, nor replace its model.
    taken = push(theirs, archives["other"])
    assert taken.status_code == 400 and taken.json()["error"]["param"] == "name"
    assert taken.json()["error"]["message"] == f"this organization's models are named globex/<name>, not {MODEL_ID}"
    assert ModelBuild.objects.unscoped().count() == 1 and launch_model(model_id=MODEL_ID, organization_id=outsider.organization.pk) is None


def test_a_pushed_model_is_evaluated_and_deployed_for_its_organization_only(archives, owner, outsider, monkeypatch):
    """Evaluations and deployments take the organization's own ready model; another organization
    gets what a missing model gets, byte for byte but the id."""
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)
    assert push(owner.client(), archives["good"]).status_code == 201
    assert build_run(ModelBuild.objects.unscoped().get().pk).status == "ready"
    evaluation = dict(evaluation_body(), model={"type": "model", "id": MODEL_ID})
    created = owner.client().post("/api/v1/evaluations", evaluation, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["base_model"] == MODEL_ID
    job = Job.objects.unscoped().get(public_id=created.json()["job_id"])
    assert launch_model(model_id=job.spec["model"], organization_id=job.project.organization_id)["id"] == MODEL_ID
    deployed = owner.client().post("/api/v1/deployments", {"source": {"type": "model", "id": MODEL_ID}}, format="json")
    assert deployed.status_code == 201, deployed.content
    assert (deployed.json()["name"], deployed.json()["base_model"]) == (MODEL_ID, MODEL_ID)

    theirs = outsider.client()
    for route, body, missing_body in (
        ("/api/v1/evaluations", evaluation, dict(evaluation, model={"type": "model", "id": "acme/no-such-model"})),
        ("/api/v1/deployments", {"source": {"type": "model", "id": MODEL_ID}}, {"source": {"type": "model", "id": "acme/no-such-model"}}),
    ):
        private, missing = theirs.post(route, body, format="json"), theirs.post(route, missing_body, format="json")
        assert private.status_code == missing.status_code == 400
        assert private.json()["error"]["errors"][0]["code"] == "unknown_model"
        assert private.content.decode().replace(MODEL_ID, "ID") == missing.content.decode().replace("acme/no-such-model", "ID")
    assert Evaluation.objects.unscoped().count() == 1 and Deployment.objects.unscoped().count() == 1


def test_the_same_bytes_again_answer_the_same_check_and_a_new_version_waits_for_its_own(archives, owner, monkeypatch):
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)
    first = push(owner.client(), archives["good"])
    again = push(owner.client(), archives["good"])
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["build"] == first.json()["build"]
    busy = push(owner.client(), archives["other"])
    assert busy.status_code == 409 and busy.json()["error"]["message"] == f"check 1 of {MODEL_ID} is still queued; push again once it ends"
    build_run(ModelBuild.objects.unscoped().get().pk)
    revision = Model.objects.get(id=MODEL_ID).revision

    second = push(owner.client(), archives["other"])
    assert second.status_code == 201 and second.json()["build"]["number"] == 2
    assert Model.objects.get(id=MODEL_ID).revision == revision  # the ready version trains until the new one passes
    build_run(ModelBuild.objects.unscoped().get(number=2).pk)
    model = Model.objects.get(id=MODEL_ID)
    assert model.status == "ready" and model.revision != revision
    assert storage.object_storage().exists(f"models/{MODEL_ID}/{revision}/model.safetensors")  # a job may still read it

    refused = push(owner.client(), archives["pickled"])
    build_run(ModelBuild.objects.unscoped().get(number=3).pk)
    assert refused.status_code == 201
    after = Model.objects.get(id=MODEL_ID)
    assert (after.status, after.revision) == ("ready", model.revision)  # a refused version leaves the ready one


@pytest.mark.parametrize(
    ("archive", "error"),
    [
        ("pickled", "the directory holds pickle files, which run code when loaded: optimizer.pt; Lab loads safetensors only"),
        ("linked", "the archive holds 'vocab.json', which is not a regular file (links are refused)"),
    ],
)
def test_a_refused_archive_fails_its_check_with_the_reason_and_its_log(archives, owner, spec, monkeypatch, archive, error):
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)
    assert push(owner.client(), archives[archive]).status_code == 201
    build = build_run(ModelBuild.objects.unscoped().get().pk)
    assert build.status == "failed" and build.error.startswith(error)
    model = Model.objects.get(id=MODEL_ID)
    assert (model.status, model.files) == ("failed", [])
    assert not list(storage.iter_objects(f"models/{MODEL_ID}/"))
    detail = owner.client().get(f"/api/v1/models/{MODEL_ID}").json()
    assert (detail["status"], detail["build"]["status"]) == ("failed", "failed") and detail["build"]["error"].startswith(error)
    log = owner.client().get(f"/api/v1/models/{MODEL_ID}/build-log").content.decode()
    assert f"refused: {error}" in log
    answer = owner.client().post("/api/v1/jobs", dict(spec, model=MODEL_ID), format="json").json()["error"]["errors"][0]
    assert answer["code"] == "model_not_ready" and f"its check 1 is failed: {error}" in answer["message"]


def test_a_push_without_a_file_a_name_or_the_right_to_write_is_refused(owner, archives, monkeypatch):
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)
    client = owner.client()
    no_file = client.post("/api/v1/models", {"name": MODEL_ID}, format="multipart")
    with archives["good"].open("rb") as handle:
        no_name = client.post("/api/v1/models", {"file": handle}, format="multipart")
    bad_name = push(client, archives["good"], name="acme/../etc")
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    read_only = push(owner.client(read_key), archives["good"])
    assert [(answer.status_code, answer.json()["error"]["param"]) for answer in (no_file, no_name, bad_name)] == [
        (400, "file"), (400, "name"), (400, "name"),
    ]
    assert (read_only.status_code, read_only.json()["error"]["code"]) == (403, "insufficient_scope")
    assert not Model.objects.filter(id__startswith="acme/").exists() and not ModelBuild.objects.unscoped().exists()


def test_an_archive_over_the_limit_is_refused_before_it_is_stored(owner, archives, settings):
    settings.LAB_MODEL_MAX_BYTES = 1024
    answer = push(owner.client(), archives["good"])
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"
    body = io.BytesIO(b"x" * 2048)
    body.name = "model.tar"
    direct = owner.client().post("/api/v1/models", {"name": MODEL_ID, "file": body}, format="multipart")
    assert direct.status_code == 413
    assert not Model.objects.filter(id=MODEL_ID).exists()
    assert not list(storage.iter_objects(f"models/uploads/{owner.organization.public_id}/"))


def test_the_sweep_fails_a_check_its_worker_lost_and_sends_a_forgotten_one_again(owner, archives, monkeypatch):
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)
    sent = []
    monkeypatch.setattr(builds, "send", lambda name, *ids: sent.append((name, *ids)))
    push(owner.client(), archives["good"])
    build = ModelBuild.objects.unscoped().get()
    ModelBuild.objects.unscoped().filter(pk=build.pk).update(created_at=timezone.now() - timedelta(seconds=builds.REQUEUE_AFTER_S + 1))
    assert build_sweep() == {"failed": 0, "resent": 1} and sent == [(TaskName.CHECK_MODEL, build.pk)]
    ModelBuild.objects.unscoped().filter(pk=build.pk).update(
        status="running", started_at=timezone.now() - timedelta(hours=2), created_at=timezone.now()
    )
    assert build_sweep() == {"failed": 1, "resent": 0}
    build.refresh_from_db()
    assert build.status == "failed" and "did not finish within" in build.error
    assert Model.objects.get(id=MODEL_ID).status == "failed"
    assert json.loads(json.dumps(owner.client().get(f"/api/v1/models/{MODEL_ID}").json()))["build"]["status"] == "failed"
