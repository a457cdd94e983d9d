"""How the policy travels to vLLM (`LAB_ENGINE_VLLM_WEIGHTS`): the choice, and the adapter's formats.

No vLLM engine starts here; tests/engine/test_vllm_backend.py runs both paths on one.
"""

import json

import pytest
import torch

from engine.commands.attempt import load_config
from engine.config import ConfigError, lora_rank_bound, weights_format
from engine.models import tiny_random_llama
from engine.policy import PolicyAdapter, is_adapter_dir, make_trainable, policy_adapter, policy_weights, takes_adapter
from engine.vllm_backend import merged_adapter_weights

from .conftest import write_spec


def test_auto_takes_merged_weights_on_cpu_and_an_adapter_on_cuda():
    assert weights_format("auto", lora_rank=16, cuda_available=False) == "merged"
    assert weights_format("auto", lora_rank=16, cuda_available=True) == "lora"
    assert weights_format("auto", lora_rank=4) == ("lora" if torch.cuda.is_available() else "merged")
    # Past vLLM's largest max_lora_rank auto stays merged; forced, it is refused.
    assert weights_format("auto", lora_rank=1024, cuda_available=True) == "merged"
    with pytest.raises(ValueError, match="rank 1 to 512, not 1024"):
        weights_format("lora", lora_rank=1024, cuda_available=True)


def test_full_fine_tuning_and_the_transformers_backend_always_take_merged_weights():
    assert weights_format("lora", lora_rank=0, cuda_available=True) == "merged"
    assert weights_format("auto", lora_rank=0, cuda_available=True) == "merged"
    assert weights_format("lora", lora_rank=8, rollout_backend="transformers") == "merged"
    assert weights_format("lora", lora_rank=8, cuda_available=False) == "lora"
    assert weights_format("merged", lora_rank=8, cuda_available=True) == "merged"
    with pytest.raises(ValueError, match="must be one of auto, merged, lora, not 'adapter'"):
        weights_format("adapter", lora_rank=8)


def test_it_rounds_the_adapter_rank_up_to_one_vllm_starts_with():
    assert [lora_rank_bound(rank) for rank in (1, 2, 4, 8, 9, 16, 17, 64, 300, 512)] == [1, 8, 8, 8, 16, 16, 32, 64, 320, 512]
    for rank in (0, 513):
        with pytest.raises(ValueError):
            lora_rank_bound(rank)


def test_the_engine_refuses_an_unknown_setting_before_loading_anything(tmp_path, monkeypatch):
    spec = write_spec(tmp_path / "spec.json")
    monkeypatch.setenv("LAB_ENGINE_VLLM_WEIGHTS", "adapter")
    with pytest.raises(ConfigError, match="LAB_ENGINE_VLLM_WEIGHTS must be one of auto, merged, lora") as refused:
        load_config(spec, tmp_path / "models")
    assert refused.value.code == "internal_error"
    monkeypatch.setenv("LAB_ENGINE_VLLM_WEIGHTS", "lora")
    config, _ = load_config(spec, tmp_path / "models")
    assert config.vllm_weights == "lora"
    # The transformers backend (the default) takes merged weights whatever the setting says.
    assert not config.policy_travels_as_adapter


def test_an_adapter_merged_by_the_backend_equals_the_trainers_merged_weights(tmp_path):
    model, _ = tiny_random_llama()
    base = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    policy = make_trainable(model, lora_rank=4, lora_alpha=8, base_model_id="lab/tiny-random-llama")
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    adapter = policy_adapter(policy)
    assert adapter.rank == 4
    # Every projection vLLM adapts in a llama model, in each layer.
    assert {name.rsplit(".", 1)[-1] for name in adapter.config["target_modules"]} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    directory = adapter.save(tmp_path / "policy-1")
    assert is_adapter_dir(directory) and sorted(p.name for p in directory.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((directory / "adapter_config.json").read_text())["lora_alpha"] == 8
    read = PolicyAdapter.read(directory)
    merged = dict(merged_adapter_weights(read, base))
    expected = dict(policy_weights(policy))
    assert sorted(merged) == sorted(expected) and len(merged) == 2 * 7
    for name, tensor in expected.items():
        assert torch.allclose(merged[name], tensor, atol=1e-6), name
    # The copy is the adapter as it was: training on changes nothing in it.
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_A" in name:
                parameter.add_(1.0)
    assert all(torch.equal(adapter.tensors[name], read.tensors[name]) for name in read.tensors)


def test_only_a_backend_that_applies_adapters_is_sent_one():
    model, _ = tiny_random_llama()
    policy = make_trainable(model, lora_rank=4, lora_alpha=8, base_model_id="lab/tiny-random-llama")

    class Backend:
        weights_format = "lora"

    assert takes_adapter(Backend(), policy)
    assert not takes_adapter(object(), policy)  # a backend that says nothing takes merged weights
    full, _ = tiny_random_llama()
    assert not takes_adapter(Backend(), make_trainable(full, lora_rank=0, lora_alpha=8, base_model_id="lab/tiny-random-llama"))
    with pytest.raises(ValueError, match="full fine-tuning has no adapter"):
        policy_adapter(full)
