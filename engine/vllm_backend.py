"""A rollout backend on vLLM for GPU pods. NOT YET RUN: no machine here has vLLM.

Written against vLLM's documented offline API (`vllm.LLM`, `SamplingParams`,
`TokensPrompt`, `LLM.collective_rpc` with a `worker_extension_cls`, as in vLLM's RLHF
examples) and kept thin on purpose. It implements `engine.rollout.RolloutBackend`:

- `generate`: token-id prompts, `n` samples each, `logprobs=0` (vLLM then returns the sampled
  token's log-probability) with `logprobs_mode="processed_logprobs"`, so the values are under
  the temperature-scaled distribution the trainer scores; `top_k=-1, top_p=1` (no filtering).
- `load_weights`: a weight reload after each optimizer step. The trainer sends merged weights
  under Hugging Face names (`engine.policy.policy_weights`); the worker extension hands them
  to the vLLM model's own `load_weights`, which maps HF names onto its fused layers.

Selected with `LAB_ENGINE_ROLLOUT=vllm`; vLLM (with the CUDA torch it needs) is listed in
requirements-gpu.txt and is never installed on CPU machines.
"""

from __future__ import annotations

from typing import Iterable

import torch

from engine.rollout import Completion


class WorkerExtension:
    """Methods vLLM mixes into each GPU worker (`worker_extension_cls`), called by collective_rpc."""

    def lab_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Load (HF name, tensor) pairs into this worker's model; return how many were given."""
        self.model_runner.model.load_weights(weights=named_tensors)
        return len(named_tensors)


class VLLMBackend:
    """Sample with vLLM from a Hugging Face model directory (the model cache's layout)."""

    def __init__(self, model_path: str, *, seed: int, max_model_len: int, gpu_memory_utilization: float = 0.35, dtype: str = "bfloat16"):
        from vllm import LLM

        self.llm = LLM(
            model=model_path,
            tokenizer=model_path,
            seed=seed,
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,  # the trainer shares the GPU
            enable_prefix_caching=True,  # a group's prompts are identical
            logprobs_mode="processed_logprobs",
            worker_extension_cls="engine.vllm_backend.WorkerExtension",
        )

    def generate(self, prompts: list[list[int]], *, n: int = 1, max_tokens: int, temperature: float, seed: int) -> list[Completion]:
        """Sample `n` completions per prompt; returned prompt by prompt, as the interface says."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=n, temperature=temperature, top_p=1.0, top_k=-1, max_tokens=max_tokens,
            logprobs=0, seed=seed, skip_special_tokens=False,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        completions = []
        for output in outputs:
            for sample in output.outputs:
                token_ids = list(sample.token_ids)
                logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], token_ids)]
                completions.append(Completion(token_ids=token_ids, logprobs=logprobs, truncated=sample.finish_reason == "length"))
        return completions

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload the policy's weights (HF names) into every vLLM worker."""
        weights = [(name, tensor.detach().to("cpu")) for name, tensor in named_tensors]
        self.llm.collective_rpc("lab_load_weights", args=(weights,))
