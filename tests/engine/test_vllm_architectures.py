"""The vLLM rollout backend with each architecture beside the tiny Llama's
(tests/engine/test_vllm_backend.py) on vLLM's CPU build: the tiny mixture of experts
(`lab/tiny-random-qwen3-moe`), Qwen2 and Qwen3: sampling under the trainer's distribution, and the
policy's new weights (full fine-tuning, and a LoRA policy merged) loaded in place.

One vLLM engine per architecture (about 15–40 s to start on 2 cores), one test each; `e2e` as
tests/engine/test_vllm_backend.py.
"""

import copy

import pytest
import torch

from engine.catalog import TINY_RANDOM_QWEN2_ID, TINY_RANDOM_QWEN3_ID, TINY_RANDOM_QWEN3_MOE_ID
from engine.grpo import token_logprobs_and_entropy
from engine.models import tiny_random_model
from engine.policy import completion_logits, make_trainable, pack_rollouts, policy_weights, trainable_parameters
from engine.vllm_backend import VLLMBackend

pytestmark = pytest.mark.e2e

SAMPLING = dict(n=3, max_tokens=12, temperature=0.7, seed=5)


def prompts_of(tokenizer, count):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"reverse: {'abcdefgh'[i:]}"}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for i in range(count)
    ]


@pytest.fixture(scope="module", params=[TINY_RANDOM_QWEN3_MOE_ID, TINY_RANDOM_QWEN2_ID, TINY_RANDOM_QWEN3_ID],
                ids=["qwen3-moe", "qwen2", "qwen3"])
def tiny(request, tmp_path_factory):
    """The architecture's tiny model id, the model, its tokenizer, and one fp32 vLLM engine on its saved weights."""
    workdir = tmp_path_factory.mktemp("vllm")
    model, tokenizer = tiny_random_model(request.param)
    model.save_pretrained(workdir / "model", safe_serialization=True)
    backend = VLLMBackend(
        workdir / "model", seed=0, max_model_len=256, stop_token_ids=[tokenizer.eos_token_id], workdir=workdir, dtype="float32",
    )
    yield request.param, model, tokenizer, backend
    backend.close()


def scored_logprobs(policy, tokenizer, prompts, completions):
    """The trainer's log-probabilities of each completion's tokens under `policy` (temperature 0.7)."""
    packed = pack_rollouts(prompts, [c.token_ids for c in completions], SAMPLING["n"], tokenizer.pad_token_id)
    with torch.no_grad():
        scored, _ = token_logprobs_and_entropy(completion_logits(policy.eval(), packed), packed.completion_ids, SAMPLING["temperature"])
    return [scored[row, : len(c.token_ids)] for row, c in enumerate(completions)]


def assert_samples_from(policy, tokenizer, prompts, completions):
    for completion, scored in zip(completions, scored_logprobs(policy, tokenizer, prompts, completions)):
        assert len(completion.token_ids) > 0
        assert torch.allclose(scored, torch.tensor(completion.logprobs), atol=1e-4)


def test_it_samples_each_architecture_and_loads_its_new_weights_in_place(tiny):
    model_id, model, tokenizer, backend = tiny
    prompts = prompts_of(tokenizer, 4)
    assert_samples_from(model, tokenizer, prompts, backend.generate(prompts, **SAMPLING))

    # Full fine-tuning: every weight moved (a mixture of experts' fused 3-D weights and routers included).
    full = make_trainable(copy.deepcopy(model), lora_rank=0, lora_alpha=0, base_model_id=model_id)
    torch.manual_seed(1)
    with torch.no_grad():
        for _, parameter in trainable_parameters(full):
            parameter.add_(torch.randn_like(parameter) * parameter.std())
    if model_id == TINY_RANDOM_QWEN3_MOE_ID:
        assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.gate.weight"} <= dict(policy_weights(full)).keys()
    backend.load_weights(policy_weights(full), policy_version=1)
    completions = backend.generate(prompts, **SAMPLING)
    assert {c.policy_version for c in completions} == {1}
    assert_samples_from(full, tokenizer, prompts, completions)
    before = scored_logprobs(model, tokenizer, prompts, completions)
    assert max((a - torch.tensor(c.logprobs)).abs().max().item() for a, c in zip(before, completions)) > 0.05  # the weights matter

    # A LoRA policy (a mixture of experts' experts adapted as peft's ParamWrapper) travels merged, from the base weights.
    lora = make_trainable(copy.deepcopy(model), lora_rank=4, lora_alpha=8, base_model_id=model_id)
    with torch.no_grad():
        for _, parameter in trainable_parameters(lora):
            parameter.normal_(std=0.3)
    backend.load_weights(policy_weights(lora), policy_version=2)
    assert_samples_from(lora, tokenizer, prompts, backend.generate(prompts, **SAMPLING))

    backend.load_weights([], policy_version=3)  # the base weights again
    assert_samples_from(model, tokenizer, prompts, backend.generate(prompts, **SAMPLING))
