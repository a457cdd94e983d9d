#!/usr/bin/env bash
# GPU check of the RL engine, for a lent GPU machine (docs/architecture.md "Tests and benchmarks": anything needing a GPU runs here).
#
# Prints the GPU and the versions, then runs bench/gpu_check.py (its docstring has the details),
# which builds a ~0.5B Qwen2-shaped model (Qwen2.5-0.5B's config) with seeded random weights into
# the model cache (no model files travel) and prints one JSON line per figure, each with name,
# value, unit and device; what cannot run here prints "value": null and "not_run": <why>.
#   trainer: the engine's GRPO step, transformers rollouts, 256 rollouts (32 prompts x 8) of 128
#     tokens, STEPS timed steps after a warm-up, LoRA rank 16 (_lora16) and full fine-tuning (_full),
#     from the trainer's own metrics (metrics.jsonl):
#       gpu_trainer_tokens_per_s_*     tokens/s  (prompt + completion tokens) / time/train
#       gpu_generation_tokens_per_s_*  tokens/s  completion tokens / time/generate
#       gpu_step_s_*                   s         mean time/step
#       gpu_peak_memory_gb_*           GiB       torch.cuda.max_memory_allocated
#   vllm (where `import vllm` works; else not_run): engine/vllm_backend.py on the same model, eager as the engine runs it
#       gpu_vllm_generation_tokens_per_s       tokens/s  merged weights
#       gpu_vllm_weight_reload_s               s         load_weights of the whole state dict (completions then carry version 1)
#       gpu_vllm_adapter_load_s                s         load_adapter of a peft model's PolicyAdapter (max_lora_rank 16)
#       gpu_vllm_lora_generation_tokens_per_s  tokens/s  with the adapter (completions carry its version)
#   distributed: torchrun --standalone --nproc-per-node 2 -m engine run --offline
#       gpu_distributed_nccl_step_s_{lora16,full}  s  NCCL, LoRA and FSDP2; with one GPU not_run (NCCL needs a
#                                                     GPU per rank and refuses two ranks on one GPU)
#       distributed_gloo_step_s_{lora,full}        s  2 gloo ranks on the CPU, the built-in tiny model (always)
# Reference: prime-rl reports ~12.3k trainer tokens/s for a 0.6B model on one H100.
#
# Needs torch (CUDA), transformers, peft, accelerate, safetensors, filelock. The job spec is built
# through labsdk.spec where pydantic imports (the CUDA vLLM brings it), else from the script's
# FallbackSpec; `python -m engine run` needs labsdk, so without pydantic the distributed part
# prints not_run. The same script runs on CPU as a smoke run: python bench/gpu_check.py --smoke
# (tests/bench/test_gpu_check.py).
# Usage: bash bench/gpu_check.sh [STEPS] [gpu_check.py options, e.g. --parts trainer,vllm]
#   (STEPS timed per mode after one warm-up step; default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export LAB_MODEL_DIR="${LAB_MODEL_DIR:-/tmp/lab-gpu-check/models}"
export PYTHONPATH="$PWD:$PWD/sdk${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python3}"
STEPS=3
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then STEPS="$1"; shift; fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" - <<'PY'
import importlib, sys
import torch
versions = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"cuda {torch.version.cuda}",
            f"gpus {torch.cuda.device_count()}"]
for name in ("transformers", "peft", "vllm", "pydantic"):
    try:
        versions.append(f"{name} {importlib.import_module(name).__version__}")
    except ImportError:
        versions.append(f"{name} absent")
print(" ".join(versions), flush=True)
PY

exec "$PYTHON" bench/gpu_check.py --steps "$STEPS" "$@"
