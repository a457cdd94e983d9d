"""The engine trains every architecture of the catalogue's tiny test models (Llama, Qwen2, Qwen3,
Qwen3-MoE), with LoRA and with full fine-tuning, in process on the transformers backend; a
mixture of experts reports its routing and resumes exactly."""

import copy
import json
import math

import pytest
import torch

from engine.catalog import (
    LORA_TARGET_MODULES,
    TINY_RANDOM_LLAMA_ID,
    TINY_RANDOM_MODEL_IDS,
    TINY_RANDOM_QWEN2_ID,
    TINY_RANDOM_QWEN3_ID,
    TINY_RANDOM_QWEN3_MOE_ID,
    list_models,
)
from engine.colocated import InProcessRollouts
from engine.models import tiny_random_model
from engine.policy import make_trainable, policy_weights, trainable_parameters
from engine.reporter import OfflineTransport, Reporter
from engine.trainer import Trainer
from tests.engine.conftest import engine_config, tiny_spec
from tests.support.engine import train

ARCHITECTURES = {
    TINY_RANDOM_LLAMA_ID: "LlamaForCausalLM",
    TINY_RANDOM_QWEN2_ID: "Qwen2ForCausalLM",
    TINY_RANDOM_QWEN3_ID: "Qwen3ForCausalLM",
    TINY_RANDOM_QWEN3_MOE_ID: "Qwen3MoeForCausalLM",
}
MODES = {"lora": {"lora_rank": 4, "lora_alpha": 8}, "full": {"lora_rank": 0, "learning_rate": 1e-3}}


def small_spec(model_id, mode, **overrides):
    """Two steps of two groups of four short completions: enough for a gradient, little else."""
    settings = {"max_steps": 2, "batch_size": 8, "rollouts_per_example": 4, "seed": 3,
                "sampling": {"max_tokens": 4, "temperature": 1.0}, "checkpoints": {"interval": 0, "keep_last": 1}}
    return tiny_spec(model=model_id, **{**settings, **MODES[mode], **overrides})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_id", ARCHITECTURES)
def test_it_trains_each_architecture(tmp_path, model_id, mode):
    reporter = Reporter(OfflineTransport(tmp_path), job_id="job_1", attempt=1, spool_dir=tmp_path / "spool", heartbeat_interval=60)
    reporter.start()
    trainer = Trainer(config=engine_config(small_spec(model_id, mode)), workdir=tmp_path, reporter=reporter,
                      rollouts=InProcessRollouts())
    try:
        trainer.setup()
        before = {name: parameter.detach().clone() for name, parameter in trainer.parameters}
        assert trainer.run() == "succeeded"
    finally:
        trainer.close()
    reporter.close("succeeded", timeout=10)
    base = trainer.model.get_base_model() if mode == "lora" else trainer.model
    assert type(base).__name__ == ARCHITECTURES[model_id]
    points = {p["step"]: p["values"] for p in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert all(math.isfinite(points[step]["loss/mean"]) for step in (1, 2))
    changed = [name for name, parameter in trainer.parameters if not torch.equal(parameter.detach(), before[name])]
    assert changed, "no trainable weight changed in two steps"
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    assert (checkpoint / ("adapter_model.safetensors" if mode == "lora" else "model.safetensors")).is_file()
    moe = model_id == TINY_RANDOM_QWEN3_MOE_ID
    assert ("moe/aux_loss" in points[1]) == moe
    if moe:
        # Two of four experts per token: the loss is 2 for an even load, and no expert exceeds 4x its share.
        assert 1.0 < points[1]["moe/aux_loss"] < 4.0
        assert 0.0 <= points[1]["moe/expert_load/min"] <= 1.0 <= points[1]["moe/expert_load/max"] <= 4.0
    if mode == "lora":
        config = json.loads((checkpoint / "adapter_config.json").read_text())
        adapted = (set(config["target_modules"]), set(config.get("target_parameters") or ()))
        # A mixture of experts' expert projections are 3-D parameters, which peft targets as such.
        attention = {"q_proj", "k_proj", "v_proj", "o_proj"}
        assert adapted == ((attention, {"gate_up_proj", "down_proj"}) if moe else (set(LORA_TARGET_MODULES[base.config.model_type]), set()))
        assert any(".mlp.experts" in name for name in changed) == moe  # the experts' own LoRA weights trained
        assert not any(".mlp.gate." in name for name in changed)  # the router is not adapted


def test_the_sdk_knows_the_tiny_models_are_built_not_fetched():
    from labsdk._checkpoints import BUILT_MODELS

    assert BUILT_MODELS == TINY_RANDOM_MODEL_IDS == set(ARCHITECTURES)


def test_the_catalogue_names_each_tiny_models_architecture():
    models = list_models()
    for model_id, class_name in ARCHITECTURES.items():
        model, _ = tiny_random_model(model_id)
        assert models[model_id].architecture == model.config.model_type
        assert type(model).__name__ == class_name
        assert models[model_id].context_length == model.config.max_position_embeddings


def test_the_merged_weights_of_a_mixture_of_experts_adapter_reproduce_its_policy():
    """What the rollout copy loads after each step (engine.policy.policy_weights) includes the
    experts' 3-D weights under the plain model's names, merged exactly."""
    model, _ = tiny_random_model(TINY_RANDOM_QWEN3_MOE_ID)
    plain = copy.deepcopy(model)
    policy = make_trainable(model, lora_rank=4, lora_alpha=8, base_model_id=TINY_RANDOM_QWEN3_MOE_ID)
    torch.manual_seed(1)
    with torch.no_grad():
        for _, parameter in trainable_parameters(policy):
            parameter.normal_(std=0.05)  # LoRA's B starts at zero: make the adapter do something
    merged = dict(policy_weights(policy))
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"} <= set(merged)
    parameters = dict(plain.named_parameters())
    with torch.no_grad():
        for name, tensor in merged.items():
            parameters[name].copy_(tensor)
    tokens = torch.tensor([[5, 6, 7, 8, 9]])
    policy.eval()
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=tokens).logits, policy(input_ids=tokens).logits, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_id", ARCHITECTURES)
def test_each_architecture_resumes_to_the_same_metrics(tmp_path, model_id, mode):
    def config():
        return engine_config(small_spec(model_id, mode, max_steps=3, checkpoints={"interval": 1, "keep_last": 3}),
                             overlap=False)

    uninterrupted = train(tmp_path / "a", config())
    train(tmp_path / "b", config(), stop_after=1)
    resumed = train(tmp_path / "c", config(), resume_from=tmp_path / "b" / "checkpoints" / "step-000001")
    assert resumed == {step: uninterrupted[step] for step in (2, 3)}
    assert all(("moe/expert_load/max" in values) == (model_id == TINY_RANDOM_QWEN3_MOE_ID) for values in resumed.values())
