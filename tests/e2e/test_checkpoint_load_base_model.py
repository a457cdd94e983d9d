"""``lab.checkpoints.load`` on a user's own machine, which has no model cache: the SDK fetches the
adapter's base model from Lab (``GET /models/{owner}/{name}/archive``, a tar of Lab's model-cache
directory with its SHA-256) into the user's own cache once, then loads the adapter on it."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from labsdk import Lab
from labsdk._checkpoints import Checkpoints
from labsdk.errors import NotFoundError
from labsdk.model_cache import model_cache_dir

from engine.models import tiny_random_llama
from jobs.services import job_submit
from lab.audit import Actor
from tests.support.jobs_helpers import Engine, ready_checkpoint
from tests.support.tars import tar_of
from tests.support.tiny_lora import tiny_lora

pytestmark = [pytest.mark.usefixtures("no_broker"), pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

BASE = "test/tiny-llama"


@pytest.fixture
def server(settings, tmp_path):
    """Lab's own model cache holding the tiny model as ``test/tiny-llama``, its own storage and data dir."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    settings.LAB_MODEL_DIR = tmp_path / "server-models"
    settings.LAB_DATA_DIR = tmp_path / "server-data"
    base, tokenizer = tiny_random_llama()
    base.save_pretrained(settings.LAB_MODEL_DIR / BASE)
    tokenizer.save_pretrained(settings.LAB_MODEL_DIR / BASE)
    (settings.LAB_MODEL_DIR / BASE / ".cache").mkdir()  # hidden: left out of the archive
    (settings.LAB_MODEL_DIR / BASE / ".cache" / "lock").write_text("x")
    return settings


def adapter_checkpoint(tenant, tmp_path) -> tuple[str, dict]:
    """A ready checkpoint of a job on ``test/tiny-llama``: a LoRA adapter whose ``lora_B`` is non-zero."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user),
                     data={"model": BASE, "max_steps": 4, "env": [{"id": "lab/addition"}]})
    model, _ = tiny_lora(0.01)
    directory = tmp_path / "adapter"
    model.save_pretrained(directory)
    config = json.loads((directory / "adapter_config.json").read_text())
    (directory / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": BASE}))
    files = {path.relative_to(directory).as_posix(): path.read_bytes() for path in directory.rglob("*") if path.is_file()}
    checkpoint_id, _ = ready_checkpoint(Engine(job), step=4, data=tar_of(files))
    return checkpoint_id, {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def test_load_fetches_the_base_model_into_the_users_own_cache_once(server, tenant, live_server, tmp_path, monkeypatch):
    import peft

    user_cache = tmp_path / "home-cache"
    monkeypatch.setenv("LAB_MODEL_DIR", str(user_cache))
    checkpoint_id, expected = adapter_checkpoint(tenant, tmp_path)

    with Lab(api_key=tenant.key, base_url=live_server.url, timeout=30) as lab:
        model = lab.checkpoints.load(checkpoint_id, progress=False)

        assert isinstance(model, peft.PeftModel)
        loaded = {name: p for name, p in model.named_parameters() if "lora_" in name}
        assert loaded.keys() == expected.keys() and all(torch.equal(loaded[name], expected[name]) for name in loaded)
        fetched = user_cache / BASE
        assert (fetched / "config.json").is_file() and (fetched / "model.safetensors").is_file()
        assert not (fetched / ".cache").exists()
        assert (user_cache / "checkpoints" / checkpoint_id / "adapter_config.json").is_file()

        monkeypatch.setattr(Checkpoints, "fetch_base_model", lambda *args, **kwargs: pytest.fail("fetched twice"))
        again = lab.checkpoints.load(checkpoint_id, path=tmp_path / "second", progress=False)
        assert isinstance(again, peft.PeftModel)


def test_the_archive_carries_its_sha256_and_is_built_once(server, tenant, read_key):
    client = tenant.client(read_key)  # a read-only key of the organization may read catalogue models

    first = client.get(f"/api/v1/models/{BASE}/archive")
    second = client.get(f"/api/v1/models/{BASE}/archive")

    assert first.status_code == 200 and first["Content-Type"] == "application/x-tar"
    body = b"".join(first.streaming_content)
    assert first["X-Lab-Archive-SHA256"] == hashlib.sha256(body).hexdigest() == second["X-Lab-Archive-SHA256"]
    assert int(first["Content-Length"]) == len(body)
    assert 'filename="test--tiny-llama.tar"' in first["Content-Disposition"]
    archives = list((server.LAB_DATA_DIR / "cache" / "model-archives" / BASE).glob("*.tar"))
    assert len(archives) == 1
    assert b"".join(second.streaming_content) == body  # the same bytes, from the archive built once


@pytest.mark.parametrize("model_id", ["nobody/nothing", "lab/tiny-random-llama"])
def test_a_model_lab_does_not_store_is_a_404(server, tenant, live_server, tmp_path, model_id):
    with Lab(api_key=tenant.key, base_url=live_server.url, timeout=10) as lab, pytest.raises(NotFoundError):
        lab.checkpoints.fetch_base_model(model_id, tmp_path / "target", progress=False)
    assert not (tmp_path / "target").exists()


def test_the_users_cache_defaults_to_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("LAB_MODEL_DIR", raising=False)
    monkeypatch.setenv("LAB_DATA_DIR", str(tmp_path))  # the server's setting no longer decides the SDK's cache
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_cache_dir() == tmp_path / "home" / ".cache" / "lab" / "models"
