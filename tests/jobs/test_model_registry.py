"""The model registry (``jobs.models.Model``): seeded from the engine's catalogue, listed at
``GET /models`` with the models offered to everyone and the organization's own, and a private
model of another organization unknown at submit, exactly as a missing one."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from engine.catalog import SMOLLM2_ID, TINY_RANDOM_LLAMA_ID, TINY_RANDOM_QWEN3_MOE_ID, list_models
from jobs.models import Model
from jobs.registry import memory_estimate_gb, sync_models

pytestmark = pytest.mark.django_db

PRIVATE_ID = "acme/private-llama"


def _private_model(organization) -> Model:
    return Model.objects.create(
        id=PRIVATE_ID, family="llama", architecture="llama", parameters=1_000_000, context_length=2048,
        training_modes=["lora"], lora_target_modules=["q_proj", "v_proj"], memory_gb=memory_estimate_gb(1_000_000),
        source="local", organization=organization,
    )


def test_migrate_seeds_the_registry_with_the_catalogue(settings, tmp_path):
    settings.LAB_MODEL_DIR = tmp_path
    rows = {model.id: model for model in Model.objects.all()}
    assert set(list_models(tmp_path)) <= set(rows)
    smol = rows[SMOLLM2_ID]
    assert (smol.family, smol.architecture, smol.organization_id) == ("llama", "llama", None)
    assert smol.parameters == 134_515_008 and smol.context_length == 8192 and smol.chat_template
    assert smol.training_modes == ["lora", "full"]
    assert smol.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # 134.5M parameters × 2 bytes × 1.2 = 0.32 GB for LoRA; × 16 bytes × 1.2 = 2.58 GB in full
    assert smol.memory_gb == {"lora": 0.4, "full": 2.6}
    moe = rows[TINY_RANDOM_QWEN3_MOE_ID]
    assert (moe.family, moe.architecture, moe.parameters, moe.active_parameters) == ("qwen3", "qwen3_moe", 81_088, 56_512)
    assert moe.memory_gb == {"lora": 0.1, "full": 0.1}  # rounded up to 0.1 GB


def test_sync_is_idempotent_and_registers_an_operator_placed_directory(settings, tmp_path):
    settings.LAB_MODEL_DIR = tmp_path
    directory = tmp_path / "acme" / "placed"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "qwen3", "max_position_embeddings": 4096}')
    (directory / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    Model.objects.filter(id=SMOLLM2_ID).update(description="stale")

    out = StringIO()
    call_command("models", "sync", stdout=out)
    assert out.getvalue().startswith("models: 1 created, 1 updated")
    placed = Model.objects.get(id="acme/placed")
    assert (placed.source, placed.family, placed.context_length, placed.chat_template) == ("local", "qwen3", 4096, True)
    assert placed.organization_id is None
    assert Model.objects.get(id=SMOLLM2_ID).description != "stale"

    before = list(Model.objects.order_by("id").values())
    assert sync_models(Model) == (0, 0)
    assert list(Model.objects.order_by("id").values()) == before


def test_sync_leaves_an_organizations_model_alone(owner, settings, tmp_path):
    settings.LAB_MODEL_DIR = tmp_path
    directory = tmp_path / "acme" / "private-llama"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 512}')
    _private_model(owner.organization)
    sync_models(Model)
    model = Model.objects.get(id=PRIVATE_ID)
    assert (model.organization_id, model.context_length) == (owner.organization.pk, 2048)


def test_models_lists_the_public_models_and_the_organizations_own(owner, outsider):
    _private_model(owner.organization)
    mine = {model["id"]: model for model in owner.client().get("/api/v1/models").json()["data"]}
    assert {SMOLLM2_ID, TINY_RANDOM_LLAMA_ID, PRIVATE_ID} <= set(mine)
    assert mine[PRIVATE_ID]["owned_by"] == owner.organization.slug
    assert mine[PRIVATE_ID]["modes"] == ["lora"]
    smol = mine[SMOLLM2_ID]
    assert smol["owned_by"] is None
    assert {key: smol[key] for key in ("family", "parameters", "context_length", "modes")} == {
        "family": "llama", "parameters": 134_515_008, "context_length": 8192, "modes": ["lora", "full"],
    }
    assert smol["memory_gb"] == {"lora": 0.4, "full": 2.6}

    theirs = {model["id"] for model in outsider.client().get("/api/v1/models").json()["data"]}
    assert PRIVATE_ID not in theirs
    assert set(mine) - theirs == {PRIVATE_ID}


def test_another_organizations_model_is_unknown_at_submit_like_a_missing_one(owner, outsider, spec):
    _private_model(owner.organization)
    accepted = owner.client().post("/api/v1/jobs", dict(spec, model=PRIVATE_ID), format="json")
    assert accepted.status_code == 201, accepted.json()

    private = outsider.client().post("/api/v1/jobs", dict(spec, model=PRIVATE_ID), format="json")
    missing = outsider.client().post("/api/v1/jobs", dict(spec, model="acme/no-such-model"), format="json")
    assert private.status_code == missing.status_code == 400
    assert private.json()["error"]["errors"][0]["code"] == "unknown_model"
    assert private.content.decode().replace(PRIVATE_ID, "ID") == missing.content.decode().replace("acme/no-such-model", "ID")
    archive = outsider.client().get(f"/api/v1/models/{PRIVATE_ID}/archive")
    assert archive.status_code == 404
