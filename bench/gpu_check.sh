#!/usr/bin/env bash
# GPU check of the RL engine, for a lent GPU machine (docs/architecture.md "Tests and benchmarks": anything needing a GPU runs here).
#
# Builds a ~0.5B Qwen2-shaped model (Qwen2.5-0.5B's config) with seeded random weights into a
# model cache (no model files travel: the machine reaches no registry and receives at most
# 64 MiB), then runs the engine's real GRPO step on the GPU with the transformers rollout
# backend: LoRA rank 16, then full fine-tuning, 256 rollouts (32 prompts x 8) of 128 tokens.
# Every group is trained (skip_equal_reward_groups off), since a random model's rewards carry
# no signal and the point is throughput. Prints one JSON line per figure:
#   gpu_trainer_tokens_per_s     (prompt + completion tokens) / time/train
#   gpu_generation_tokens_per_s  completion tokens / time/generate
#   gpu_step_s, gpu_peak_memory_gb
# Reference: prime-rl reports ~12.3k trainer tokens/s for a 0.6B model on one H100.
#
# Needs torch (CUDA), transformers, peft, accelerate, safetensors, filelock: the engine's
# trainer path imports nothing else (no pydantic, no labsdk, no vLLM).
# Usage: bash bench/gpu_check.sh [STEPS]   (STEPS timed per mode after one warm-up step; default 3)
# Then, where the CUDA vLLM is installed, the vLLM rollout backend on the same model
# (gpu_vllm_generation_tokens_per_s); elsewhere a line with "not_run" says it could not run.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export LAB_MODEL_DIR="${LAB_MODEL_DIR:-/tmp/lab-gpu-check/models}"
export GPU_CHECK_STEPS="${1:-3}"
PYTHON="${PYTHON:-python3}"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c 'import sys, torch, transformers, peft; print(f"python {sys.version.split()[0]} torch {torch.__version__} cuda {torch.version.cuda} transformers {transformers.__version__} peft {peft.__version__}")'

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - <<'PY'
import json
import os
import pathlib
import string
import tempfile
import time
from types import SimpleNamespace

import torch
import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers

from engine.models import CHATML_TEMPLATE
from engine.reporter import OfflineTransport, Reporter
from engine.trainer import EngineConfig, Trainer

assert torch.cuda.is_available(), "no CUDA device"
MODEL_ID = "lab/gpu-check-qwen-0.5b"
STEPS = int(os.environ["GPU_CHECK_STEPS"])
model_dir = pathlib.Path(os.environ["LAB_MODEL_DIR"]) / MODEL_ID

started = time.perf_counter()
if not (model_dir / "config.json").exists():
    # Qwen2.5-0.5B's shape: a character vocabulary padded with filler tokens to its 151,936 ids.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab_size = 151_936
    tokens = specials + characters + [f"<|x{i}|>" for i in range(vocab_size - len(specials) - len(characters))]
    backend = tokenizers.Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="?")
    tokenizer.chat_template = CHATML_TEMPLATE
    config = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    print(json.dumps({"name": "gpu_model_parameters", "value": sum(p.numel() for p in model.parameters()), "unit": "params"}))
    del model
    torch.cuda.empty_cache()
print(f"model ready in {time.perf_counter() - started:.1f}s", flush=True)


def measure(lora_rank: int) -> None:
    label = "lora16" if lora_rank else "full"
    # What the trainer reads of a job spec, as plain attributes: labsdk.spec needs pydantic,
    # which the GPU machine does not have.
    spec = SimpleNamespace(
        model=MODEL_ID, env=[SimpleNamespace(id="lab/reverse-text", args={"min_length": 4, "max_length": 12})],
        max_steps=STEPS + 1, batch_size=256, rollouts_per_example=8, learning_rate=1e-5,
        lora_rank=lora_rank, lora_alpha=32, seed=0, max_off_policy_steps=1, init_from=None,
        sampling=SimpleNamespace(max_tokens=128, temperature=1.0),
        eval=SimpleNamespace(interval=0, num_examples=32),
        checkpoints=SimpleNamespace(interval=0, keep_last=1),
    )
    config = EngineConfig(spec=spec, overlap=False, micro_batch_rollouts=64, skip_equal_reward_groups=False)
    with tempfile.TemporaryDirectory() as workdir:
        workdir = pathlib.Path(workdir)
        reporter = Reporter(OfflineTransport(workdir), job_id="gpu-check", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
        reporter.start()
        trainer = Trainer(config=config, workdir=workdir, reporter=reporter)
        trainer.setup()
        counts = {}
        generate = trainer._generate_batch

        def counting_generate(step, version, backend):
            batch = generate(step, version, backend)
            completion = sum(len(c.token_ids) for c in batch.completions)
            prompt = sum(len(batch.prompts[r // spec.rollouts_per_example]) for r in range(len(batch.completions)))
            counts[step] = (prompt, completion)
            return batch

        trainer._generate_batch = counting_generate
        torch.cuda.reset_peak_memory_stats()
        trainer.run()
        reporter.close("succeeded", timeout=10)
        points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    timed = [p for p in points if p["step"] > 1]
    train_s = sum(p["values"]["time/train"] for p in timed)
    generate_s = sum(p["values"]["time/generate"] for p in timed)
    step_s = sum(p["values"]["time/step"] for p in timed) / len(timed)
    trained_tokens = sum(sum(counts[p["step"]]) for p in timed)
    completion_tokens = sum(counts[p["step"]][1] for p in timed)
    for name, value, unit in (
        (f"gpu_trainer_tokens_per_s_{label}", trained_tokens / train_s, "tokens/s"),
        (f"gpu_generation_tokens_per_s_{label}", completion_tokens / generate_s, "tokens/s"),
        (f"gpu_step_s_{label}", step_s, "s"),
        (f"gpu_peak_memory_gb_{label}", torch.cuda.max_memory_allocated() / 2**30, "GiB"),
    ):
        print(json.dumps({"name": name, "value": round(value, 2), "unit": unit, "steps_timed": len(timed)}), flush=True)
    del trainer
    torch.cuda.empty_cache()


measure(lora_rank=16)
measure(lora_rank=0)
PY

# The vLLM rollout backend (engine/vllm_backend.py) on the same model, where the CUDA vLLM of
# requirements-gpu.txt is installed; otherwise one line says it was not run. Written to a file
# because vLLM starts worker processes that re-import the main module.
if "$PYTHON" -c 'import vllm' 2>/dev/null; then
  script="$(mktemp --suffix=.py)"
  cat > "$script" <<'PY'
import json, os, pathlib, tempfile, time

from safetensors.torch import load_file

from engine.vllm_backend import VLLMBackend


def main():
    model_dir = pathlib.Path(os.environ["LAB_MODEL_DIR"]) / "lab/gpu-check-qwen-0.5b"
    with tempfile.TemporaryDirectory() as workdir:
        backend = VLLMBackend(model_dir, seed=0, max_model_len=1024, stop_token_ids=[2], workdir=pathlib.Path(workdir), enforce_eager=False)
        prompts = [[1, 10 + i, 20 + i, 30 + i] for i in range(32)]
        backend.generate(prompts, n=8, max_tokens=128, temperature=1.0, seed=0)
        started = time.perf_counter()
        completions = backend.generate(prompts, n=8, max_tokens=128, temperature=1.0, seed=1)
        seconds = time.perf_counter() - started
        state = load_file(str(next(model_dir.glob("*.safetensors"))))
        backend.load_weights(state.items(), policy_version=1)
        print(json.dumps({"name": "gpu_vllm_generation_tokens_per_s", "value": round(sum(len(c.token_ids) for c in completions) / seconds, 1), "unit": "tokens/s", "startup_s": round(backend.startup_seconds, 1), "weight_reload_s": round(backend.reload_seconds, 2), "policy_version": completions[0].policy_version}), flush=True)
        backend.close()


if __name__ == "__main__":
    main()
PY
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$script"
  rm -f "$script"
else
  echo '{"name": "gpu_vllm_generation_tokens_per_s", "value": null, "unit": "tokens/s", "not_run": "vLLM is not installed here (requirements-gpu.txt); the vLLM backend and its weight reload ran only on CPU (tests/engine/test_vllm_backend.py)"}'
fi
