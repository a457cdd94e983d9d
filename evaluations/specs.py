"""The body of ``POST /evaluations`` (docs/evaluations.md) and the evaluation job's spec made from it.

``parse_request`` checks the body's shape (a 400 ``invalid_request`` listing every problem, with
dotted params such as ``environments.0.num_examples``); ``resolve_target`` finds what is scored
(another tenant's checkpoint is the same 404 as a missing one); ``job_spec`` writes the job spec
whose ``[eval]`` section is the evaluation (engine/evaluation.py reads it), so that the model,
the environments, their arguments and packages, the context length and the pool are checked by
the one check every job passes (``jobs.specs.validate_job_spec``), whose problems
``evaluation_problems`` names in the body's terms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from django.conf import settings
from labsdk.spec.values import MetadataKey, MetadataValue, Text
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, ValidationError, field_validator

from evaluations.models import TargetType
from jobs.evaluation_samples import evaluation_plan
from jobs.models import Adapter, AdapterStatus, Checkpoint, CheckpointFormat, CheckpointStatus, Job
from jobs.registry.selectors import installed_models
from lab.errors import FieldError, LabError, not_found
from lab.models import Project
from serving.models import Deployment, DeploymentStatus

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
#: Environments one evaluation may name, and examples and rollouts per environment (the job
#: spec's own bounds: ``env`` blocks, ``[[eval.env]]`` num_examples and rollouts_per_example).
MAX_ENVIRONMENTS = 16
MAX_EXAMPLES = 10_000
MAX_ROLLOUTS = 256
#: ``num_examples`` that takes the environment's whole eval split.
ALL_EXAMPLES = "all"
#: Restarts of an evaluation job after a crash (a crash costs the samples of the attempt that
#: crashed nothing: each one is stored once).
MAX_RESTARTS = 2


class EvaluationTarget(BaseModel):
    """What is scored: ``{"type": "model", "id": "<catalogue id>"}``, ``{"type": "checkpoint",
    "id": "ckpt_..."}``, ``{"type": "adapter", "id": "adp_..."}``, an OpenAI-compatible endpoint
    ``{"type": "endpoint", "base_url": "https://host/v1", "model": "<its model id>",
    "api_key_secret": "<a job secret's name>"}``, or a deployment of the project ``{"type":
    "deployment", "id": "dep_...", "api_key_secret": "<a job secret holding a Lab API key>"}``."""

    model_config = _STRICT
    type: Literal["model", "checkpoint", "adapter", "endpoint", "deployment"]
    id: Annotated[Text, StringConstraints(min_length=1, max_length=256)] | None = None
    base_url: Annotated[Text, StringConstraints(min_length=1, max_length=2048)] | None = None
    model: Annotated[Text, StringConstraints(min_length=1, max_length=256)] | None = Field(
        None, description="endpoint: the model id the endpoint serves"
    )
    api_key_secret: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)] | None = Field(
        None, description="endpoint, deployment: the name of the job secret (in secrets) holding the endpoint's API key"
    )


class EvaluationEnvironment(BaseModel):
    """One environment: its id, its arguments, how many examples of its eval split (a count, or
    ``"all"``; -1 is taken as ``"all"``) and rollouts per example."""

    model_config = _STRICT
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    args: dict[str, JsonValue] = Field(default_factory=dict)
    num_examples: Annotated[int, Field(ge=-1, le=MAX_EXAMPLES)] | Literal["all"] = 32
    rollouts_per_example: Annotated[int, Field(ge=1, le=MAX_ROLLOUTS)] = 1

    @field_validator("num_examples")
    @classmethod
    def _all_or_positive(cls, value: int | str) -> int | str:
        if value == -1:
            return ALL_EXAMPLES
        if value == 0:
            raise ValueError('num_examples must be at least 1, or "all"')
        return value


class EvaluationSamplingSettings(BaseModel):
    """How completions are sampled: temperature (0 = greedy), nucleus ``top_p``, tokens per
    completion, and the seed of prompts and sampling."""

    model_config = _STRICT
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    max_tokens: Annotated[int, Field(ge=1, le=131_072)] = 128
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0


class EvaluationResources(BaseModel):
    """What the evaluation job runs on (the job spec's ``[resources]``)."""

    model_config = _STRICT
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=32)] = "cpu"
    gpus: Annotated[int, Field(ge=0, le=64)] | None = None


class EvaluationCreate(BaseModel):
    """The body of ``POST /evaluations``."""

    model_config = _STRICT
    name: Annotated[Text, StringConstraints(min_length=1, max_length=128)] | None = None
    model: EvaluationTarget
    environments: Annotated[list[EvaluationEnvironment], Field(min_length=1, max_length=MAX_ENVIRONMENTS)]
    sampling: EvaluationSamplingSettings = Field(default_factory=EvaluationSamplingSettings)
    resources: EvaluationResources = Field(default_factory=EvaluationResources)
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=32)
    secrets: dict[str, str] = Field(
        default_factory=dict, max_length=100,
        description="Job secrets given to the evaluation's engine alone (name: value), as POST /jobs takes them: "
        "an endpoint's API key, an environment's judge key. Never shown again.",
    )


def _param(location: tuple) -> str:
    """A pydantic error location as a dotted param: field names and list indexes (the names of
    union branches pydantic adds, ``constrained-int``, are left out)."""
    return ".".join(str(part) for part in location if isinstance(part, int) or str(part).isidentifier())


def parse_request(data: Any) -> EvaluationCreate:
    """Return the validated body. Raises LabError ``invalid_request`` listing every problem
    (shape, bounds, unknown keys, an environment listed twice), nothing else checked yet."""
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    try:
        parsed = EvaluationCreate.model_validate(data)
    except ValidationError as error:
        raise pydantic_problems(error) from None
    ids = [environment.id for environment in parsed.environments]
    duplicates = [
        FieldError(f"environments.{index}.id", "duplicate", f"{ids[index]} is listed twice; an evaluation scores each environment once")
        for index in range(len(ids)) if ids[index] in ids[:index]
    ]
    if duplicates:
        raise _invalid(duplicates)
    return parsed


def pydantic_problems(error: ValidationError) -> LabError:
    """Return a body's validation ``error`` as LabError ``invalid_request`` listing every problem
    under its dotted param, one per field (a union reports each of its branches)."""
    errors, seen = [], set()
    for problem in error.errors(include_url=False):
        param = _param(problem["loc"]) or None
        if param in seen:
            continue
        seen.add(param)
        errors.append(FieldError(param=param, code=problem["type"], message=problem["msg"]))
    return _invalid(errors)


def _invalid(errors: list[FieldError]) -> LabError:
    first = errors[0]
    message = f"{first.param}: {first.message}" if first.param else first.message
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return LabError("invalid_request", message, errors=errors)


@dataclass(frozen=True)
class Target:
    """What an evaluation scores: its type and id (an endpoint's: the model it serves), the
    catalogue model its weights start from (an endpoint's job spec names one; its engine loads
    none), the checkpoint or adapter (None for a model) with its LoRA rank and alpha (0 =
    full), or the endpoint (``{"base_url", "model", "api_key_var"}``, the job spec's
    ``[eval.endpoint]``)."""

    type: str
    id: str
    base_model: str
    checkpoint: Checkpoint | None = None
    lora_rank: int = 0
    lora_alpha: int = 16
    adapter: Adapter | None = None
    endpoint: dict[str, str] | None = None

    @property
    def details(self) -> dict[str, Any]:
        """What the Evaluation object says of an endpoint besides its model: ``{"endpoint":
        {"base_url", "api_key_secret"}}`` (the secret's name, never its value); empty otherwise."""
        if self.endpoint is None:
            return {}
        return {"endpoint": {"base_url": self.endpoint["base_url"], "api_key_secret": self.endpoint["api_key_var"]}}


#: An absolute http(s) URL with a host (the job spec's ``[eval.endpoint] base_url`` rule).
_HTTP_URL = re.compile(r"https?://[^/?#@\s\x00-\x1f\x7f]+(?:[/?#][^\s\x00-\x1f\x7f]*)?", re.IGNORECASE)
#: The path of Lab's OpenAI-compatible API, under its public URL (serving/api).
OPENAI_API_PATH = "/api/v1/openai/v1"


def _required(param: str) -> LabError:
    return LabError("invalid_request", f"{param}: required", errors=[FieldError(param, "missing", "required")])


def _refuse_keys(target: EvaluationTarget, allowed: tuple[str, ...]) -> None:
    """Refuse the target's keys its type does not take (``invalid_request`` naming each)."""
    given = [key for key in ("id", "base_url", "model", "api_key_secret") if getattr(target, key) is not None]
    extra = [key for key in given if key not in allowed]
    if extra:
        raise LabError(
            "invalid_request", f"model.{extra[0]}: a {target.type} target takes {', '.join(allowed)}",
            errors=[FieldError(f"model.{key}", "unexpected", f"a {target.type} target takes {', '.join(allowed)}") for key in extra],
        )


def resolve_target(*, project: Project, target: EvaluationTarget) -> Target:
    """Return what ``target`` names in ``project``. Raises LabError ``invalid_request`` for a
    missing or unexpected key of its type (param ``model.<key>``) and an endpoint URL that is not
    http(s) (``model.base_url``); ``not_found`` for a checkpoint, adapter or deployment that is
    missing or another project's (the same answer); ``checkpoint_not_ready`` and
    ``adapter_not_ready`` for one of this project that is not ``ready``, ``invalid_state`` for a
    deployment that is stopped or failed. A model id, and the secret an endpoint names, are
    checked with the job spec (``validate_job_spec``)."""
    if target.type in (TargetType.MODEL, TargetType.CHECKPOINT, TargetType.ADAPTER):
        _refuse_keys(target, ("id",))
        if target.id is None:
            raise _required("model.id")
    if target.type == TargetType.MODEL:
        return Target(TargetType.MODEL, target.id, target.id)
    if target.type == TargetType.CHECKPOINT:
        return _artifact_target(project, TargetType.CHECKPOINT, target.id)
    if target.type == TargetType.ADAPTER:
        return _artifact_target(project, TargetType.ADAPTER, target.id)
    if target.type == TargetType.DEPLOYMENT:
        _refuse_keys(target, ("id", "api_key_secret"))
        return _deployment_target(project, target)
    _refuse_keys(target, ("base_url", "model", "api_key_secret"))
    for key in ("base_url", "model", "api_key_secret"):
        if getattr(target, key) is None:
            raise _required(f"model.{key}")
    if not _HTTP_URL.fullmatch(target.base_url):
        raise LabError(
            "invalid_request", "model.base_url: must be an http:// or https:// URL with a host, e.g. https://host/v1",
            errors=[FieldError("model.base_url", "invalid_value", "must be an http:// or https:// URL with a host")],
        )
    endpoint = {"base_url": target.base_url, "model": target.model, "api_key_var": target.api_key_secret}
    return Target(TargetType.ENDPOINT, target.model, _endpoint_spec_model(project), endpoint=endpoint)


def _artifact_target(project: Project, target_type: str, artifact_id: str) -> Target:
    """A checkpoint or an adapter of the project's jobs (``target_type``): its job's base model,
    and its LoRA rank and alpha (0 for full weights), which the evaluation's job spec must repeat
    for the engine to load it. ``not_found`` for a missing one or another project's (the same
    answer), ``checkpoint_not_ready`` / ``adapter_not_ready`` for one that is not ``ready``."""
    name, model, ready = (
        ("checkpoint", Checkpoint, CheckpointStatus.READY) if target_type == TargetType.CHECKPOINT
        else ("adapter", Adapter, AdapterStatus.READY)
    )
    artifact = model.objects.for_project(project).select_related("job").filter(public_id=artifact_id).first()
    if artifact is None:
        raise not_found(name)
    if artifact.status != ready:
        raise LabError(
            f"{name}_not_ready", f"{name.capitalize()} {artifact.public_id} is {artifact.status}; only a ready one can be evaluated.",
            param="model.id",
        )
    source = artifact.job.spec
    lora = name == "checkpoint" or artifact.format == CheckpointFormat.PEFT_LORA
    return Target(
        target_type, artifact.public_id, str(source.get("model", "")), **{name: artifact},
        lora_rank=int(source.get("lora_rank") or 0) if lora else 0, lora_alpha=int(source.get("lora_alpha") or 16),
    )


def _deployment_target(project: Project, target: EvaluationTarget) -> Target:
    """A deployment of the project, as the endpoint Lab's OpenAI-compatible API is for it: its
    name as the model, at ``LAB_PUBLIC_URL`` + ``OPENAI_API_PATH``; the API key (one of the
    project's Lab API keys) is the job secret ``api_key_secret`` names."""
    if target.id is None:
        raise _required("model.id")
    deployment = Deployment.objects.for_project(project).filter(public_id=target.id).first()
    if deployment is None:
        raise not_found("deployment")
    if target.api_key_secret is None:
        raise _required("model.api_key_secret")
    if deployment.status in (DeploymentStatus.UNLOADING, DeploymentStatus.STOPPED, DeploymentStatus.FAILED):
        raise LabError(
            "invalid_state", f"Deployment {deployment.public_id} is {deployment.status}; only an active one can be evaluated.",
            param="model.id",
        )
    endpoint = {
        "base_url": settings.LAB_PUBLIC_URL + OPENAI_API_PATH, "model": deployment.name, "api_key_var": target.api_key_secret,
    }
    return Target(TargetType.DEPLOYMENT, deployment.public_id, deployment.base_model, endpoint=endpoint)


def _endpoint_spec_model(project: Project) -> str:
    """The catalogue model an endpoint evaluation's job spec names (every job spec names one; the
    engine loads none): of the installed models, one outside Lab's model store (nothing to
    fetch), then the one with the longest context, so that the spec's ``max_tokens`` check
    refuses the least, then the smallest. ``""`` when none is installed (the job spec's check
    then says so)."""
    models = installed_models(project.organization).values()
    chosen = min(
        models, key=lambda model: (bool(model.files), -model.context_length, model.parameters or 0, model.id), default=None,
    )
    return chosen.id if chosen is not None else ""


def job_spec(*, request: EvaluationCreate, target: Target, evaluation_id: str) -> dict[str, Any]:
    """Return the job spec of an evaluation: its environments as ``[[eval.env]]`` blocks (and as
    the ``env`` blocks a job spec needs), its sampling as ``[eval.sampling]`` (``top_p`` in
    ``extra_body``), the seed, the model and the checkpoint it starts from (``init_from``, with
    the checkpoint's LoRA rank and alpha), one step that is never trained."""
    sampling = request.sampling
    eval_sampling: dict[str, Any] = {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature}
    if sampling.top_p < 1.0:
        eval_sampling["extra_body"] = {"top_p": sampling.top_p}
    spec: dict[str, Any] = {
        "name": request.name or f"evaluation of {target.id}",
        "model": target.base_model,
        "max_steps": 1,
        "batch_size": 1,
        "rollouts_per_example": 1,
        "seed": sampling.seed,
        "lora_rank": target.lora_rank,
        "lora_alpha": target.lora_alpha,
        "max_restarts": MAX_RESTARTS,
        "sampling": {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature},
        "env": [{"id": environment.id, "args": dict(environment.args)} for environment in request.environments],
        "eval": {
            "interval": 0,
            "env": [
                {
                    "id": environment.id,
                    "args": dict(environment.args),
                    "num_examples": -1 if environment.num_examples == ALL_EXAMPLES else environment.num_examples,
                    "rollouts_per_example": environment.rollouts_per_example,
                }
                for environment in request.environments
            ],
            "sampling": eval_sampling,
        },
        "checkpoints": {"interval": 0, "keep_last": 1},
        "resources": request.resources.model_dump(exclude_none=True),
        "metadata": {"evaluation": evaluation_id},
    }
    if target.checkpoint is not None:
        spec["init_from"] = target.checkpoint.public_id
    if target.adapter is not None:
        spec["eval"]["adapter"] = target.adapter.public_id
    if target.endpoint is not None:
        spec["eval"]["endpoint"] = dict(target.endpoint)
    if request.secrets:
        spec["secrets"] = dict(request.secrets)
    return spec


def _body_param(param: str | None) -> str | None:
    """The body's name of a job spec param: ``eval.env.N...`` and ``env.N...`` are
    ``environments.N...``, the model and the checkpoint are ``model.id``, the sampling settings
    ``sampling.*``; others (``resources.*``) keep theirs."""
    if param is None:
        return None
    for prefix, body in (("eval.env.", "environments."), ("env.", "environments."), ("eval.sampling.", "sampling.")):
        if param.startswith(prefix):
            return body + param[len(prefix):]
    if param in ("model", "init_from", "lora_rank", "eval.adapter"):
        return "model.id"
    if param.startswith("eval.endpoint."):
        return {"api_key_var": "model.api_key_secret"}.get(param[len("eval.endpoint."):], "model." + param[len("eval.endpoint."):])
    if param == "seed":
        return "sampling.seed"
    return param


def evaluation_problems(error: LabError) -> LabError:
    """Return the job spec's refusal (``validate_job_spec``) in the body's terms:
    ``invalid_request`` with each problem once, under the body's param; other refusals (402 of
    billing) as they are."""
    if error.code != "invalid_spec":
        return error
    errors, seen = [], set()
    for problem in error.errors:
        param = _body_param(problem.param)
        if (param, problem.code) in seen:
            continue
        seen.add((param, problem.code))
        message = problem.message.replace("this job's model", "the evaluated model")
        errors.append(FieldError(param, problem.code, message))
    return _invalid(errors or [FieldError(None, "invalid", error.message)])


def final_checkpoint_body(*, job: Job, checkpoint: Checkpoint) -> dict[str, Any]:
    """Return the body of the evaluation a succeeded training ``job``'s ``[eval]
    evaluate_final_checkpoint`` asks for: its final ``checkpoint`` on the environments, examples
    and rollouts its ``[eval]`` evaluates (``jobs.evaluation_samples.evaluation_plan``), sampled as
    ``[eval.sampling]`` over ``[sampling]`` says (``top_p`` from their ``extra_body``), with the
    job's seed, on the job's kind of GPU (one) or the CPU."""
    spec = job.spec
    sampling, overrides = spec.get("sampling") or {}, (spec.get("eval") or {}).get("sampling") or {}
    extra = {**(sampling.get("extra_body") or {}), **(overrides.get("extra_body") or {})}
    temperature = overrides.get("temperature")
    return {
        "name": f"final checkpoint of {job.name or job.public_id}"[:128],
        "model": {"type": TargetType.CHECKPOINT, "id": checkpoint.public_id},
        "environments": [
            {
                "id": planned.id,
                "args": planned.args,
                "num_examples": ALL_EXAMPLES if planned.num_examples is None else planned.num_examples,
                "rollouts_per_example": planned.rollouts_per_example,
            }
            for planned in evaluation_plan(spec)
        ],
        "sampling": {
            "temperature": float(sampling.get("temperature", 1.0) if temperature is None else temperature),
            "top_p": float(extra.get("top_p", 1.0)),
            "max_tokens": overrides.get("max_tokens") or sampling.get("max_tokens", 128),
            "seed": spec.get("seed", 0),
        },
        "resources": {"gpu_type": job.gpu_type, **({"gpus": 1} if job.gpu_type != "cpu" else {})},
        "metadata": {"job": job.public_id},
    }
