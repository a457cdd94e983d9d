"""``lab.checkpoints.load``: a ready LoRA checkpoint comes back as a peft model on its base model
from the local model cache, nothing fetched from a hub; and the model card the engine writes into
each checkpoint (``engine.checkpoints.model_card``)."""

from __future__ import annotations

import pytest
import torch

from engine import checkpoint_archives as archives
from engine import checkpoints as ckpt
from engine.models import tiny_random_llama
from tests.support.tiny_lora import tiny_lora

TINY = "lab/tiny-random-llama"
SPEC = {"name": "addition-tiny", "model": TINY, "max_steps": 4, "env": [{"id": "lab/addition", "args": {}}]}


@pytest.fixture
def model_cache(tmp_path):
    """A model cache holding the tiny model's directory, as a GPU pod's model volume would."""
    base, tokenizer = tiny_random_llama()
    base.save_pretrained(tmp_path / "models" / "lab" / "tiny-random-llama")
    tokenizer.save_pretrained(tmp_path / "models" / "lab" / "tiny-random-llama")
    return tmp_path / "models"


@pytest.fixture
def adapter_archive(tmp_path):
    """A checkpoint of a LoRA adapter on the tiny model with non-zero weights, as one tar."""
    model, tokenizer = tiny_lora(0.01)
    card = ckpt.model_card(base_model=TINY, job_id="job_1", step=4, max_steps=4, spec=SPEC,
                           metrics={"reward/mean": 0.375, "loss/mean": 0.0125, "optim/lr": 1e-3},
                           checkpoint_format=ckpt.FORMAT_LORA, test_model=True)
    directory = ckpt.save_checkpoint(
        tmp_path / "work" / "step-000004", model=model, tokenizer=tokenizer,
        optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]),
        state=ckpt.TrainerState(step=4, data_position=4, seed=0, spec_digest="d", format=ckpt.FORMAT_LORA), card=card,
    )
    archive = directory.with_name("step-000004.tar")
    archives.write_tar(directory, archive)
    expected = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    return archive.read_bytes(), expected


def test_it_loads_a_lora_checkpoint_on_the_base_model_from_the_cache(fake_lab, lab_client, model_cache,
                                                                     adapter_archive, tmp_path):
    import peft

    fake_lab.archives["ckpt_1"] = adapter_archive[0]

    model = lab_client.checkpoints.load("ckpt_1", model_dir=model_cache, path=tmp_path / "ckpt_1", progress=False)

    assert isinstance(model, peft.PeftModel)
    loaded = {name: p for name, p in model.named_parameters() if "lora_" in name}
    assert loaded.keys() == adapter_archive[1].keys()
    assert all(torch.equal(loaded[name], adapter_archive[1][name]) for name in loaded)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor([[3, 4, 5]])).logits).all()
    # A second load reuses the unpacked directory: no second download.
    downloads = sum(1 for r in fake_lab.requests if r.path.endswith("/download"))
    lab_client.checkpoints.load("ckpt_1", model_dir=model_cache, path=tmp_path / "ckpt_1", progress=False)
    assert sum(1 for r in fake_lab.requests if r.path.endswith("/download")) == downloads == 1


def test_a_base_model_missing_from_the_cache_is_named(fake_lab, lab_client, adapter_archive, tmp_path):
    fake_lab.archives["ckpt_1"] = adapter_archive[0]
    empty = tmp_path / "empty-cache"

    with pytest.raises(FileNotFoundError, match=r"adapter for lab/tiny-random-llama, which is not in the model cache at .*empty-cache/lab/tiny-random-llama"):
        lab_client.checkpoints.load("ckpt_1", model_dir=empty, path=tmp_path / "ckpt_1", progress=False)


def test_a_base_model_passed_in_is_used(fake_lab, lab_client, adapter_archive, tmp_path):
    import peft

    fake_lab.archives["ckpt_1"] = adapter_archive[0]
    base, _ = tiny_random_llama()

    model = lab_client.checkpoints.load("ckpt_1", base_model=base, path=tmp_path / "ckpt_1", progress=False)

    assert isinstance(model, peft.PeftModel)


def test_the_model_card_names_the_catalogue_base_model_job_step_reward_and_spec(adapter_archive, tmp_path):
    import io
    import json
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(adapter_archive[0])) as archive:
        card = archive.extractfile("README.md").read().decode()
        adapter_config = json.load(archive.extractfile("adapter_config.json"))

    assert adapter_config["base_model_name_or_path"] == TINY
    front = card.split("---\n")[1]
    assert front.splitlines() == [
        'base_model: "lab/tiny-random-llama"', "library_name: peft", "tags:", "- lab", "- grpo", "- lora", "- test-model",
    ]
    assert "Lab job `job_1`" in card and "after step 4 of 4" in card
    assert "| `reward/mean` | 0.375 |" in card and "optim/lr" not in card
    assert "**This is a test model.**" in card
    assert json.loads(card.split("```json\n")[1].split("```")[0]) == SPEC


def test_a_real_model_card_says_how_to_load_it_offline():
    card = ckpt.model_card(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", job_id="job_2", step=10, max_steps=20,
                           metrics={"reward/mean": 0.5}, spec={}, checkpoint_format=ckpt.FORMAT_LORA)

    assert "test model" not in card.lower().replace("- test-model", "")
    assert 'lab.checkpoints.load("ckpt_...")' in card
    assert 'os.path.join(os.environ["LAB_MODEL_DIR"], "HuggingFaceTB/SmolLM2-135M-Instruct")' in card
