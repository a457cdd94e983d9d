"""A model from Lab's model store (engine.model_store): fetched once per machine into the model
cache with every file's size and SHA-256 checked, then in the engine's catalogue so a job trains
it; bytes that are not those Lab recorded are refused, nothing half-fetched is kept."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import pytest
import torch
from safetensors.torch import load_file

from engine import catalog
from engine.colocated import InProcessRollouts
from engine.commands.attempt import job_model
from engine.config import ConfigError
from engine.model_store import MODEL_VARIABLE, StoredModel, StoredModelError, cache_path, prepare_job_model
from engine.models import load_model
from engine.reporter import OfflineTransport, Reporter
from engine.trainer import Trainer
from tests.engine.conftest import engine_config, tiny_spec
from tests.support.model_dirs import tiny_model_directory

MODEL_ID = "acme/stored-qwen3"


@pytest.fixture(autouse=True)
def forget_stored_models():
    yield
    catalog._STORED_MODELS.clear()


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A tiny Qwen3 as Lab's filesystem store holds it: its files under a revision folder."""
    return tiny_model_directory(tmp_path_factory.mktemp("storage") / "models" / MODEL_ID / "rev1")


def manifest(directory, **changes) -> dict:
    files = [
        {"path": path.name, "size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "url": path.as_uri()}
        for path in sorted(directory.iterdir())
    ]
    return {"id": MODEL_ID, "revision": "rev1", "architecture": "qwen3", "context_length": 512, "parameters": 80_576,
            "files": files} | changes


def test_it_fetches_the_files_once_and_the_engine_loads_the_model_from_the_cache(stored, tmp_path):
    environ = {MODEL_VARIABLE: json.dumps(manifest(stored))}
    path = prepare_job_model(tmp_path / "cache", environ)
    assert path == tmp_path / "cache" / ".store" / MODEL_ID / "rev1"
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in stored.iterdir())
    assert catalog.list_models(tmp_path / "cache")[MODEL_ID].source == "store"
    model, tokenizer = load_model(MODEL_ID, tmp_path / "cache")
    weights = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(weights, load_file(str(stored / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"])
    assert tokenizer.chat_template
    # A second job on this machine reads the cache: the store need not even be there.
    moved = {**manifest(stored), "files": [{**file, "url": (tmp_path / "gone" / file["path"]).as_uri()} for file in manifest(stored)["files"]]}
    assert prepare_job_model(tmp_path / "cache", {MODEL_VARIABLE: json.dumps(moved)}) == path


def test_bytes_that_are_not_those_recorded_are_refused_and_nothing_is_kept(stored, tmp_path):
    data = manifest(stored)
    data["files"][0] = {**data["files"][0], "sha256": "0" * 64}
    with pytest.raises(StoredModelError, match="the stored bytes are not those Lab recorded") as refused:
        prepare_job_model(tmp_path / "cache", {MODEL_VARIABLE: json.dumps(data)})
    assert not refused.value.retryable
    assert not cache_path(StoredModel.from_json(json.dumps(data)), tmp_path / "cache").exists()
    assert [p.name for p in (tmp_path / "cache" / ".store" / MODEL_ID).iterdir()] == [".rev1.lock"]
    assert MODEL_ID not in catalog.list_models(tmp_path / "cache")


@pytest.mark.parametrize(
    "changes",
    [{"revision": ".."}, {"id": "no-owner"}, {"files": []}, {"files": [{"path": "../../x", "size": 1, "sha256": "a", "url": "file:///x"}]}],
)
def test_a_manifest_that_would_leave_the_cache_is_refused(stored, tmp_path, changes):
    with pytest.raises(StoredModelError):
        prepare_job_model(tmp_path / "cache", {MODEL_VARIABLE: json.dumps(manifest(stored, **changes))})
    assert not (tmp_path / "cache").exists()


def test_a_read_only_model_cache_without_the_revision_is_fetched_into_the_pods_own(stored, tmp_path, monkeypatch):
    volume = tmp_path / "volume"  # the pool's model volume, mounted read-only
    volume.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path).startswith(str(volume)) else real_access(path, mode))
    (tmp_path / "pod-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "pod-tmp"))
    path = prepare_job_model(volume, {MODEL_VARIABLE: json.dumps(manifest(stored))})
    assert path == tmp_path / "pod-tmp" / "lab-models" / ".store" / MODEL_ID / "rev1"
    assert list(volume.iterdir()) == []


def test_a_refusal_is_a_model_not_found_job_error(stored, tmp_path, monkeypatch):
    data = manifest(stored)
    data["files"][0] = {**data["files"][0], "size": 1}
    monkeypatch.setenv(MODEL_VARIABLE, json.dumps(data))
    with pytest.raises(ConfigError) as refused:
        job_model(tmp_path / "cache")
    assert refused.value.code == "model_not_found"


def test_a_job_trains_the_stored_model_with_lora_and_in_full(stored, tmp_path, monkeypatch):
    monkeypatch.setenv(MODEL_VARIABLE, json.dumps(manifest(stored)))
    monkeypatch.setenv("LAB_MODEL_DIR", str(tmp_path / "cache"))
    assert job_model() == tmp_path / "cache" / ".store" / MODEL_ID / "rev1"
    torch.set_num_threads(1)
    for lora_rank in (4, 0):
        workdir = tmp_path / f"rank-{lora_rank}"
        spec = tiny_spec(model=MODEL_ID, max_steps=1, lora_rank=lora_rank, checkpoints={"interval": 1, "keep_last": 1}, eval={})
        reporter = Reporter(OfflineTransport(workdir), job_id="job_1", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
        reporter.start()
        trainer = Trainer(config=engine_config(spec, micro_batch_rollouts=8), workdir=workdir, reporter=reporter, rollouts=InProcessRollouts())
        trainer.setup()
        assert trainer.run() == "succeeded"
        reporter.close("succeeded", timeout=10)
        points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        assert [point["step"] for point in points if "loss/mean" in point["values"]] == [1]
        assert (workdir / "checkpoints" / "step-000001.tar").is_file()
