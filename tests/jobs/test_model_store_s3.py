"""The model store on S3 (``LAB_STORAGE_URL=s3://...``), against a real moto server process: an
operator's ``models add`` and an organization's push store the files by revision in the bucket,
the engine's fetch (``engine.model_store``, as ``python -m engine prepare-model`` runs it) reads
them through the pre-signed URLs ``LAB_JOB_MODEL`` hands it and checks every file's size and
SHA-256, a tampered or missing object fails the fetch by name, and the checkpoint orphan sweep
leaves the model store's objects alone (no route or command deletes a model)."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from engine import catalog
from engine.commands.common import EXIT_INVALID, EXIT_SUCCEEDED
from engine.commands.prepare_model import prepare_model
from engine.model_store import MODEL_VARIABLE, StoredModel, StoredModelError, cache_path, prepare_job_model
from engine.models import load_model
from jobs.artifacts.lifecycle import sweep_orphans
from jobs.launchers.base import LaunchRequest, engine_package_environment
from jobs.models import Model, ModelBuild
from jobs.registry.builds import build_run
from jobs.registry.store import (
    DOWNLOAD_URL_EXPIRE_S,
    content_revision,
    describe_files,
    launch_model,
    revision_prefix,
    store_files,
    stored_model_manifest,
)
from tests.support.model_dirs import models_add, tar_directory, tiny_model_directory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker", "commit_callbacks")]

PREFIX = "lab/checkpoints"
ADDED_ID = "ops/tiny-qwen3"
PUSHED_ID = "acme/my-model"


@pytest.fixture(autouse=True)
def forget_stored_models():
    yield
    catalog._STORED_MODELS.clear()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return tiny_model_directory(tmp_path_factory.mktemp("qwen3") / "model")


def object_keys(model: Model) -> list[str]:
    return sorted(f"{PREFIX}/{model.storage_prefix}{file['path']}" for file in model.files)


def prepare(manifest: dict, model_dir: Path, monkeypatch, capsys) -> tuple[int, str]:
    """Run ``python -m engine prepare-model`` (in this process) as the local launcher does before
    a job's sandbox starts; return its exit code and what it wrote to stderr."""
    monkeypatch.setenv(MODEL_VARIABLE, json.dumps(manifest))
    monkeypatch.setenv("LAB_MODEL_DIR", str(model_dir))
    capsys.readouterr()
    code = prepare_model(argparse.Namespace(model=manifest["id"]))
    return code, capsys.readouterr().err


def test_an_operators_model_is_stored_on_s3_by_revision_and_fetched_through_its_signed_urls(
    qwen3, owner, s3_server, bucket, tmp_path, monkeypatch, capsys
):
    printed = models_add("public", ADDED_ID, "--from", str(qwen3))
    model = Model.objects.get(id=ADDED_ID)
    assert (model.status, model.source, printed["revision"]) == ("ready", "directory", model.revision)
    assert model.storage_prefix == f"models/{ADDED_ID}/{model.revision}/"
    assert printed["stored_bytes"] == model.size_bytes == sum(file["size"] for file in model.files) > 0
    assert s3_server.keys(bucket) == object_keys(model)
    client = s3_server.client()
    for file in model.files:
        body = client.get_object(Bucket=bucket, Key=f"{PREFIX}/{model.storage_prefix}{file['path']}")["Body"].read()
        assert (len(body), hashlib.sha256(body).hexdigest()) == (file["size"], file["sha256"])
        assert body == (qwen3 / file["path"]).read_bytes()
    assert store_files(qwen3, model.files, model.storage_prefix) == 0  # the revision is in the bucket: nothing written
    assert s3_server.keys(bucket) == object_keys(model)

    # A job naming it hands its engine pre-signed GETs of the revision's objects, no credential.
    manifest = launch_model(model_id=ADDED_ID, organization_id=owner.organization.pk)
    request = LaunchRequest(job_id="job_x", attempt=1, spec={}, lab_url="", token="t", model=manifest)
    assert json.loads(engine_package_environment(request)[MODEL_VARIABLE]) == manifest
    assert [file["path"] for file in manifest["files"]] == [file["path"] for file in model.files]
    for file in manifest["files"]:
        url = urlsplit(file["url"])
        query = parse_qs(url.query)
        assert f"{url.scheme}://{url.netloc}" == s3_server.endpoint_url
        assert url.path == f"/{bucket}/{PREFIX}/{model.storage_prefix}{file['path']}"
        assert query["X-Amz-Expires"] == [str(DOWNLOAD_URL_EXPIRE_S)] and "X-Amz-Signature" in query
        assert "lab-test-secret" not in file["url"]

    cache = tmp_path / "cache"
    assert prepare(manifest, cache, monkeypatch, capsys) == (EXIT_SUCCEEDED, "")
    fetched = cache / ".store" / ADDED_ID / model.revision
    assert sorted(path.name for path in fetched.iterdir()) == sorted(file["path"] for file in model.files)
    for file in model.files:
        assert (fetched / file["path"]).read_bytes() == (qwen3 / file["path"]).read_bytes()
    assert catalog.list_models(cache)[ADDED_ID].source == "store"
    loaded, tokenizer = load_model(ADDED_ID, cache)
    assert sum(parameter.numel() for parameter in loaded.parameters()) == model.parameters and tokenizer.chat_template
    # Fetched once per machine: a second job reads the cache even with the bucket emptied.
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in object_keys(model)]})
    assert prepare_job_model(cache, {MODEL_VARIABLE: json.dumps(manifest)}) == fetched


def test_a_pushed_model_is_stored_on_s3_fetched_and_left_alone_by_the_orphan_sweep(
    qwen3, owner, outsider, s3_server, bucket, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)
    archive = tar_directory(qwen3, tmp_path / "my-model.tar.gz", top="my-model", gzip=True)
    with archive.open("rb") as handle:
        pushed = owner.client().post("/api/v1/models", {"name": PUSHED_ID, "file": handle}, format="multipart")
    assert pushed.status_code == 201, pushed.content
    build = ModelBuild.objects.unscoped().get()
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert build.archive_key == f"models/uploads/{owner.organization.public_id}/{sha256}.tar"
    assert s3_server.keys(bucket) == [f"{PREFIX}/{build.archive_key}"]  # the web process only stored the archive

    assert build_run(build.pk).status == "ready"  # the worker reads the archive back from S3
    build.refresh_from_db()
    model = Model.objects.get(id=PUSHED_ID)
    assert (model.status, model.source, build.revision) == ("ready", "push", model.revision)
    assert model.revision == content_revision(model.files) and model.storage_prefix == revision_prefix(PUSHED_ID, model.revision)
    log_key = f"{PREFIX}/models/logs/{owner.organization.public_id}/{PUSHED_ID}/build-1.log"
    assert s3_server.keys(bucket) == sorted([*object_keys(model), log_key])  # the archive went once checked
    log = owner.client().get(f"/api/v1/models/{PUSHED_ID}/build-log").content.decode()
    assert f"as revision {model.revision}" in log and log.endswith("check 1: passed\n")

    manifest = launch_model(model_id=PUSHED_ID, organization_id=owner.organization.pk)
    assert all(file["url"].startswith(f"{s3_server.endpoint_url}/{bucket}/{PREFIX}/{model.storage_prefix}") for file in manifest["files"])
    assert launch_model(model_id=PUSHED_ID, organization_id=outsider.organization.pk) is None
    assert prepare(manifest, tmp_path / "cache", monkeypatch, capsys) == (EXIT_SUCCEEDED, "")
    fetched = tmp_path / "cache" / ".store" / PUSHED_ID / model.revision
    assert {path.name: path.read_bytes() for path in fetched.iterdir()} == {
        file["path"]: (qwen3 / file["path"]).read_bytes() for file in model.files
    }

    # The hourly orphan sweep removes objects no checkpoint names, but not the model store's; and
    # no route deletes a model, so its revisions stay in the bucket.
    orphan = f"{PREFIX}/job_gone/ckpt_gone.tar"
    s3_server.client().put_object(Bucket=bucket, Key=orphan, Body=b"no row names it")
    assert sweep_orphans(now=timezone.now() + timedelta(days=30)) == 1
    assert s3_server.keys(bucket) == sorted([*object_keys(model), log_key])
    assert owner.client().delete(f"/api/v1/models/{PUSHED_ID}").status_code == 405
    assert s3_server.keys(bucket) == sorted([*object_keys(model), log_key])


def test_a_tampered_or_missing_object_fails_the_fetch_by_name_and_nothing_is_cached(
    qwen3, s3_server, bucket, tmp_path, monkeypatch, capsys
):
    files = describe_files(qwen3, sorted(path.name for path in qwen3.iterdir()))
    revision = content_revision(files)
    prefix = revision_prefix("ops/stored", revision)
    store_files(qwen3, files, prefix)
    stored = Model(id="ops/stored", revision=revision, architecture="qwen3", context_length=512, parameters=80_576,
                   files=files, storage_prefix=prefix)
    manifest = stored_model_manifest(stored)
    cache = tmp_path / "cache"
    target = cache_path(StoredModel.from_json(json.dumps(manifest)), cache)
    client = s3_server.client()
    key = f"{PREFIX}/{prefix}model.safetensors"
    original = client.get_object(Bucket=bucket, Key=key)["Body"].read()

    # The same number of bytes, one changed: only the SHA-256 tells.
    client.put_object(Bucket=bucket, Key=key, Body=original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(StoredModelError, match=r"^model\.safetensors: the stored bytes are not those Lab recorded") as tampered:
        prepare_job_model(cache, {MODEL_VARIABLE: json.dumps(manifest)})
    assert not tampered.value.retryable
    code, err = prepare(manifest, cache, monkeypatch, capsys)
    assert code == EXIT_INVALID and err.startswith("model_not_found: model.safetensors: the stored bytes are not those Lab recorded")
    assert not target.exists() and [path.name for path in target.parent.iterdir()] == [f".{revision}.lock"]

    client.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(StoredModelError) as missing:
        prepare_job_model(cache, {MODEL_VARIABLE: json.dumps(manifest)})
    # S3 answers 404 NoSuchKey, or 403 to a signer that may not list the bucket (moto: 403
    # SignatureDoesNotMatch for a URL that overrides the response's headers, as these do).
    message = str(missing.value)
    assert re.fullmatch(r"model\.safetensors: .*the object is missing.* \(HTTP 40[34] [A-Za-z]+\)", message), message
    assert not missing.value.retryable
    assert not target.exists()

    # Once the object is back the same URLs fetch the revision whole.
    client.put_object(Bucket=bucket, Key=key, Body=original)
    assert prepare_job_model(cache, {MODEL_VARIABLE: json.dumps(manifest)}) == target
    assert (target / "model.safetensors").read_bytes() == original
