"""The job spec model: pydantic classes for a spec and its sections, with their defaults
and bounds, the rules across fields, and the spec's JSON Schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from labsdk.spec.problems import SpecProblem
from labsdk.spec.values import JsonLike, JsonObject, MetadataKey, MetadataValue, Text

#: Prime Intellect keys Lab accepts and stores but does not act on, as dotted paths.
#: Prime's docs spell the secrets key ``env_file``; Lab's spec says ``env_files``: both are kept.
PRIME_UNUSED_KEYS: tuple[str, ...] = (
    "oversampling_factor",
    "max_async_level",
    "trajectory_strategy",
    "env_file",
    "env_files",
    "wandb",
    "sampling.enable_thinking",
    "sampling.reasoning_effort",
)


_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class SamplingConfig(BaseModel):
    """How rollouts are sampled from the policy."""

    model_config = _STRICT

    max_tokens: int = Field(
        128, ge=1, le=131_072,
        description="Most tokens generated per completion; must fit the model's context.",
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature.")
    enable_thinking: JsonLike = Field(
        None, description="Prime Intellect key, stored but not used by Lab."
    )
    reasoning_effort: JsonLike = Field(
        None, description="Prime Intellect key, stored but not used by Lab."
    )


class EnvConfig(BaseModel):
    """One training environment and the arguments its loader takes."""

    model_config = _STRICT

    id: str = Field(
        min_length=1, max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._+-]+)?$",
        description='Environment id: built-in "lab/<name>" or uploaded '
        '"<organization slug>/<name>[@<version>]".',
    )
    args: JsonObject = Field(
        default_factory=dict,
        description="Keyword arguments for the environment; keys and JSON types must match "
        "the environment's defaults.",
    )


class EvalConfig(BaseModel):
    """Periodic evaluation on held-out examples."""

    model_config = _STRICT

    interval: int = Field(0, ge=0, le=100_000, description="Steps between evals; 0 = never.")
    num_examples: int = Field(32, ge=1, le=10_000, description="Examples per eval.")


class CheckpointsConfig(BaseModel):
    """When checkpoints are written and how many are kept."""

    model_config = _STRICT

    interval: int = Field(
        10, ge=0, le=100_000,
        description="Steps between checkpoints; 0 = only the final one.",
    )
    keep_last: int = Field(3, ge=1, le=100, description="Ready checkpoints kept per job.")


class ResourcesConfig(BaseModel):
    """What the job runs on."""

    model_config = _STRICT

    gpu_type: str = Field(
        "cpu", min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description='"cpu" for local runs, or a GPU type the pool has ("H100", "H200", ...).',
    )
    gpus: int | None = Field(
        None, ge=0, le=64,
        description="GPUs per job; default 0 on cpu, 1 otherwise.",
    )

    @model_validator(mode="after")
    def _default_gpus(self) -> ResourcesConfig:
        if self.gpus is None:
            self.gpus = 0 if self.gpu_type == "cpu" else 1
        return self


class JobSpec(BaseModel):
    """A training job: base model, environments and GRPO settings (docs/spec.md).

    Only ``model`` and ``env`` are required. Durations are in minutes where the name says
    so, counts in steps, rollouts or tokens. Prime Intellect's unused keys are fields
    here so they are stored; :func:`parse_spec` reports them as warnings.
    """

    model_config = _STRICT

    name: Text | None = Field(None, min_length=1, max_length=128, description="Display name.")
    model: Text = Field(
        min_length=1, max_length=256, description="Model catalogue id (GET /api/v1/models)."
    )
    max_steps: int = Field(20, ge=1, le=100_000, description="Training steps.")
    batch_size: int = Field(32, ge=1, le=8192, description="Rollouts per step.")
    rollouts_per_example: int = Field(
        4, ge=1, le=256,
        description="GRPO group size; batch_size must be a multiple of it.",
    )
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Optimizer learning rate.")
    lora_alpha: int = Field(16, ge=1, le=4096, description="LoRA alpha scaling factor.")
    lora_rank: int = Field(16, ge=0, le=1024, description="LoRA rank; 0 = full fine-tune.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Random seed.")
    max_restarts: int = Field(
        2, ge=0, le=20, description="Requeues after crashes before the job fails."
    )
    max_off_policy_steps: int = Field(
        1, ge=0, le=16,
        description="Rollouts may come from a policy at most this many steps old.",
    )
    priority: Literal["low", "normal", "high"] = Field("normal", description="Queue priority.")
    max_runtime_minutes: int = Field(
        600, ge=1, le=10_080, description="Wall-clock limit in minutes (at most a week)."
    )
    init_from: str | None = Field(
        None, max_length=64, pattern=r"^ckpt_[A-Za-z0-9]+$",
        description="Start from this ready checkpoint of the same project.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    env: list[EnvConfig] = Field(min_length=1, max_length=16, description="Environments.")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=16,
        description="Up to 16 string pairs for filtering jobs (keys ≤ 64, values ≤ 512).",
    )

    oversampling_factor: JsonLike = Field(
        None, description="Prime Intellect key, stored but not used by Lab."
    )
    max_async_level: JsonLike = Field(
        None, description="Prime Intellect key, stored but not used by Lab."
    )
    trajectory_strategy: JsonLike = Field(
        None, description="Prime Intellect key, stored but not used by Lab."
    )
    env_file: JsonLike = Field(None, description="Prime Intellect key, stored but not used by Lab.")
    env_files: JsonLike = Field(
        None, description="Prime Intellect key, stored but not used by Lab."
    )
    wandb: JsonLike = Field(None, description="Prime Intellect key, stored but not used by Lab.")

    @model_validator(mode="after")
    def _check_cross_field(self) -> JobSpec:
        problems = _cross_field_problems(self.model_dump(), set())
        if problems:
            first = problems[0]
            raise PydanticCustomError(first.code, first.message, {"param": first.param})
        return self


def _cross_field_problems(data: Mapping[str, Any], bad_params: set[str]) -> list[SpecProblem]:
    """Check rules spanning several fields on raw data, skipping fields already refused."""
    problems: list[SpecProblem] = []

    def plain_int(name: str) -> int | None:
        if name in bad_params:
            return None
        value = data.get(name, JobSpec.model_fields[name].default)
        return None if isinstance(value, bool) or not isinstance(value, int) else value

    batch_size = plain_int("batch_size")
    group_size = plain_int("rollouts_per_example")
    if batch_size and group_size and batch_size % group_size:
        problems.append(SpecProblem(
            "batch_size", "not_divisible",
            f"batch_size ({batch_size}) must be a multiple of rollouts_per_example "
            f"({group_size}): each step trains on whole groups",
        ))

    resources = data.get("resources")
    if isinstance(resources, Mapping) and "resources.gpus" not in bad_params:
        gpu_type = resources.get("gpu_type", ResourcesConfig.model_fields["gpu_type"].default)
        gpus = resources.get("gpus")
        if isinstance(gpus, int) and not isinstance(gpus, bool) and isinstance(gpu_type, str):
            if gpu_type == "cpu" and gpus > 0:
                problems.append(SpecProblem(
                    "resources.gpus", "invalid_value",
                    f'gpus must be 0 when gpu_type is "cpu" (got {gpus})',
                ))
            elif gpu_type != "cpu" and gpus == 0 and "resources.gpu_type" not in bad_params:
                problems.append(SpecProblem(
                    "resources.gpus", "invalid_value",
                    f'gpus must be at least 1 when gpu_type is "{gpu_type}"',
                ))
    return problems


def job_spec_json_schema() -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of a job spec, as served at
    ``/api/v1/schema/job-spec.json``. Cross-field and catalogue rules are not expressible
    in it; the API enforces them."""
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Lab job spec"
    return schema
