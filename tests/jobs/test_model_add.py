"""An operator adds a model (``manage.py models add``): from a directory or from the Hugging Face
endpoint Lab is configured with (a local server speaking the Hub's download API), checked by the
engine in bubblewrap, stored by revision with its files' digests, offered to everyone or to one
organization (another one gets ``unknown_model``, exactly as for a missing one), and handed to
the engine of a job that names it."""

from __future__ import annotations

import hashlib
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from engine.catalog import SMOLLM2_ID, TINY_RANDOM_QWEN3_MOE_ID
from jobs.launchers.base import LaunchRequest, engine_package_environment
from jobs.models import Model
from jobs.registry.store import launch_model
from lab import storage
from tests.support.model_dirs import (
    HubServer,
    model_storage,  # noqa: F401  (a fixture: an empty model store)
    models_add,
    tiny_model_directory,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("model_storage")]

PUBLIC_ID = "ops/tiny-qwen3"
PRIVATE_ID = "ops/acme-only"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return tiny_model_directory(tmp_path_factory.mktemp("qwen3") / "model")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_operator_adds_a_model_from_a_directory_for_everyone(qwen3, owner, outsider, spec):
    printed = models_add("public", PUBLIC_ID, "--from", str(qwen3))
    model = Model.objects.get(id=PUBLIC_ID)
    assert (model.status, model.source, model.organization_id, model.architecture, model.family) == ("ready", "directory", None, "qwen3", "qwen3")
    assert (model.parameters, model.active_parameters, model.context_length, model.chat_template) == (80_576, None, 512, True)
    assert model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert model.memory_gb == {"lora": 0.1, "full": 0.1}
    assert model.files == [
        {"path": path.name, "size": path.stat().st_size, "sha256": sha256(path)} for path in sorted(qwen3.iterdir())
    ]
    assert len(model.revision) == 16 and model.storage_prefix == f"models/{PUBLIC_ID}/{model.revision}/"
    for file in model.files:
        assert sha256(storage.path_of(model.storage_prefix + file["path"])) == file["sha256"]
    assert printed == {
        "id": PUBLIC_ID, "owned_by": None, "revision": model.revision, "architecture": "qwen3", "parameters": 80_576,
        "active_parameters": None, "context_length": 512, "chat_template": True, "memory_gb": {"lora": 0.1, "full": 0.1},
        "files": 6, "size_bytes": model.size_bytes, "stored_bytes": printed["stored_bytes"], "seconds": printed["seconds"],
    }
    for tenant in (owner, outsider):
        listed = {item["id"]: item for item in tenant.client().get("/api/v1/models").json()["data"]}
        assert listed[PUBLIC_ID]["status"] == "ready" and listed[PUBLIC_ID]["source"] == "directory"
        assert tenant.client().post("/api/v1/jobs", dict(spec, model=PUBLIC_ID), format="json").status_code == 201

    again = models_add("public", PUBLIC_ID, "--from", str(qwen3))
    assert (again["revision"], again["stored_bytes"]) == (model.revision, 0)


def test_a_model_added_for_one_organization_is_its_own_and_unknown_to_another_like_a_missing_one(qwen3, owner, outsider, spec):
    printed = models_add(owner.organization.slug, PRIVATE_ID, "--from", str(qwen3))
    assert printed["owned_by"] == owner.organization.slug
    assert owner.client().post("/api/v1/jobs", dict(spec, model=PRIVATE_ID), format="json").status_code == 201
    assert owner.client().get(f"/api/v1/models/{PRIVATE_ID}").json()["owned_by"] == owner.organization.slug

    theirs = outsider.client()
    assert PRIVATE_ID not in {item["id"] for item in theirs.get("/api/v1/models").json()["data"]}
    private = theirs.post("/api/v1/jobs", dict(spec, model=PRIVATE_ID), format="json")
    missing = theirs.post("/api/v1/jobs", dict(spec, model="ops/no-such-model"), format="json")
    assert private.status_code == missing.status_code == 400
    assert private.json()["error"]["errors"][0]["code"] == "unknown_model"
    assert private.content.decode().replace(PRIVATE_ID, "ID") == missing.content.decode().replace("ops/no-such-model", "ID")
    for route in ("", "/build-log", "/archive"):
        answers = [theirs.get(f"/api/v1/models/{model_id}{route}") for model_id in (PRIVATE_ID, "ops/no-such-model")]
        assert [answer.status_code for answer in answers] == [404, 404]
        assert answers[0].content == answers[1].content
    estimate = theirs.post("/api/v1/jobs/estimate", dict(spec, model=PRIVATE_ID), format="json")
    assert estimate.status_code == 400 and estimate.json()["error"]["errors"][0]["code"] == "unknown_model"

    # A job of the owner's hands its engine the model's files; one of the outsider's could not.
    manifest = launch_model(model_id=PRIVATE_ID, organization_id=owner.organization.pk)
    model = Model.objects.get(id=PRIVATE_ID)
    assert {key: manifest[key] for key in ("id", "revision", "architecture", "context_length", "parameters")} == {
        "id": PRIVATE_ID, "revision": model.revision, "architecture": "qwen3", "context_length": 512, "parameters": 80_576,
    }
    for file in manifest["files"]:
        assert file["url"] == storage.path_of(model.storage_prefix + file["path"]).as_uri()
        assert sha256(Path(storage.path_of(model.storage_prefix + file["path"]))) == file["sha256"]
    request = LaunchRequest(job_id="job_x", attempt=1, spec={}, lab_url="", token="t", model=manifest)
    assert json.loads(engine_package_environment(request)["LAB_JOB_MODEL"]) == manifest
    assert launch_model(model_id=PRIVATE_ID, organization_id=outsider.organization.pk) is None
    assert launch_model(model_id=SMOLLM2_ID, organization_id=owner.organization.pk) is None  # a built-in: the model cache's


def test_an_operator_adds_a_model_from_the_hugging_face_endpoint(tmp_path, settings, owner):
    repository = tiny_model_directory(tmp_path / "repo", TINY_RANDOM_QWEN3_MOE_ID)
    (repository / "training_args.bin").write_bytes(b"\x80\x04not loaded")
    (repository / "modeling_tiny.py").write_text("raise SystemExit('never fetched')\n")
    with HubServer() as hub:
        hub.add("Qwen/Tiny-MoE", repository, commit=COMMIT)
        settings.LAB_HF_ENDPOINT = hub.url
        errors = StringIO()
        out = StringIO()
        call_command("models", "add", "public", "Qwen/Tiny-MoE", "--revision", "main", stdout=out, stderr=errors)
        fetched = {request.rsplit("/", 1)[-1] for request in hub.requests if "/resolve/" in request}
    printed = json.loads(out.getvalue())
    model = Model.objects.get(id="Qwen/Tiny-MoE")
    assert (model.revision, model.source, model.architecture) == (COMMIT, "hub", "qwen3_moe")
    assert (model.parameters, model.active_parameters) == (81_088, 56_512)
    assert model.storage_prefix == f"models/Qwen/Tiny-MoE/{COMMIT}/"
    assert printed["revision"] == COMMIT and printed["active_parameters"] == 56_512
    assert "training_args.bin" not in fetched and "modeling_tiny.py" not in fetched
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= fetched
    assert "left out (Lab stores model files only): modeling_tiny.py, training_args.bin" in errors.getvalue()
    assert model.description == f"Qwen/Tiny-MoE from {hub.url}, revision {COMMIT}."


def test_the_endpoints_refusals_are_named(tmp_path, settings, qwen3):
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    (pickles / "config.json").write_text((qwen3 / "config.json").read_text())
    (pickles / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with HubServer() as hub:
        hub.add("Old/Pickled", pickles, commit=COMMIT)
        hub.add("Qwen/Tiny", qwen3, commit=COMMIT)
        settings.LAB_HF_ENDPOINT = hub.url
        for args, message in (
            (("Old/Pickled",), f"Old/Pickled at {COMMIT} has no safetensors weights (only pytorch_model.bin: pickles, which Lab never loads)"),
            (("Nobody/Nothing",), f"{hub.url} has no model Nobody/Nothing"),
            (("Qwen/Tiny", "--revision", "v9"), "Qwen/Tiny has no revision 'v9'"),
        ):
            with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
                models_add("public", *args)
    assert not Model.objects.filter(id__in=["Old/Pickled", "Nobody/Nothing", "Qwen/Tiny"]).exists()


def test_a_directory_the_check_refuses_is_named_and_nothing_is_stored(qwen3, tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    for path in qwen3.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"model_type": "glm4_moe"}))
    with pytest.raises(CommandError, match="ops/glm cannot be offered: config.json's model_type 'glm4_moe' is not an architecture the engine trains"):
        models_add("public", "ops/glm", "--from", str(directory))
    assert not Model.objects.filter(id="ops/glm").exists()
    assert not list(storage.iter_objects("models/ops/glm/"))


def test_an_id_held_by_a_built_in_or_another_owner_is_refused(qwen3, owner):
    with pytest.raises(CommandError, match="is one of Lab's built-in models"):
        models_add("public", SMOLLM2_ID, "--from", str(qwen3))
    Model.objects.create(id=PRIVATE_ID, context_length=512, source="directory", organization=owner.organization)
    with pytest.raises(CommandError, match=f"{PRIVATE_ID} is already offered to organization acme, not to everyone"):
        models_add("public", PRIVATE_ID, "--from", str(qwen3))
    with pytest.raises(CommandError, match="no organization 'nobody'"):
        models_add("nobody", "ops/x", "--from", str(qwen3))
    assert Model.objects.get(id=PRIVATE_ID).organization_id == owner.organization.pk


def test_the_estimate_and_submit_read_the_organizations_own_model(owner, spec, settings):
    Model.objects.create(
        id=PRIVATE_ID, family="qwen3", architecture="qwen3", parameters=70_000_000_000, context_length=4096,
        training_modes=["lora", "full"], memory_gb={"lora": 168.0, "full": 1344.0}, organization=owner.organization,
        source="directory", files=[{"path": "config.json", "size": 2, "sha256": "0" * 64}], storage_prefix="models/x/",
    )
    client = owner.client()
    # 3 steps × 8 rollouts × 8 tokens × 70e9 parameters / 7.4e9 on the CPU pool, after 20 s of start-up.
    estimate = client.post("/api/v1/jobs/estimate", dict(spec, model=PRIVATE_ID), format="json").json()
    assert estimate["cpu_seconds"] == round(20 + 192 * 70e9 / 7.4e9, 1)

    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 1}]}
    full = client.post("/api/v1/jobs", dict(spec, model=PRIVATE_ID, lora_rank=0, resources={"gpu_type": "H100", "gpus": 8}), format="json")
    assert full.status_code == 400
    assert full.json()["error"]["errors"] == [{
        "param": "resources.gpus", "code": "out_of_range",
        "message": "ops/acme-only needs about 1344.0 GB of GPU memory to train in full (an estimate from its 70,000,000,000 "
                   "parameters) and one 'H100' holds 80 GB: it needs at least 17 GPUs on one node, and this pool's 'H100' nodes have at most 8",
    }]
    lora = client.post("/api/v1/jobs", dict(spec, model=PRIVATE_ID, resources={"gpu_type": "H100", "gpus": 1}), format="json")
    assert lora.status_code == 400 and lora.json()["error"]["message"].endswith("at least 3 GPUs on one node: ask for resources.gpus = 3")
    assert client.post("/api/v1/jobs", dict(spec, model=PRIVATE_ID, resources={"gpu_type": "H100", "gpus": 3}), format="json").status_code == 201
