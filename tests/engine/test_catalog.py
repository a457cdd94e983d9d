"""The catalogues are plain data the server can import without torch."""

import json
import subprocess
import sys

from engine.catalog import list_environments, list_models

from .conftest import REPO_ROOT


def test_it_imports_the_catalog_without_torch():
    code = "import sys, engine, engine.catalog; engine.catalog.list_models(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_it_lists_the_builtin_models_and_local_directories(tmp_path):
    local = tmp_path / "acme" / "tiny-qwen"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 4096}))
    (tmp_path / "acme" / "no-config").mkdir()
    models = list_models(tmp_path)
    assert set(models) == {
        "HuggingFaceTB/SmolLM2-135M-Instruct", "lab/tiny-random-llama", "lab/tiny-random-qwen2", "lab/tiny-random-qwen3",
        "lab/tiny-random-qwen3-moe", "acme/tiny-qwen",
    }
    assert models["acme/tiny-qwen"].context_length == 4096
    assert (models["acme/tiny-qwen"].source, models["acme/tiny-qwen"].architecture) == ("local", "qwen2")
    assert models["HuggingFaceTB/SmolLM2-135M-Instruct"].context_length == 8192


def test_it_reads_the_model_dir_from_the_environment(tmp_path, monkeypatch):
    local = tmp_path / "acme" / "m"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    monkeypatch.setenv("LAB_MODEL_DIR", str(tmp_path))
    assert "acme/m" in list_models()


def test_it_lists_the_builtin_environments_with_their_default_args():
    environments = list_environments()
    assert sorted(environments) == ["lab/addition", "lab/alphabet-sort", "lab/python-code", "lab/reverse-text"]
    assert environments["lab/addition"].name == "addition"
    assert environments["lab/addition"].args["max_operand"] == 20
