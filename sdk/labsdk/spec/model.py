"""The job spec model: pydantic classes for a spec and its sections, with their defaults
and bounds, the rules across fields, and the spec's JSON Schema.

Every key of Prime Intellect's hosted-training ``RLConfig`` (prime-cli's
``commands/rl.py``) is a field here, so a Prime file validates as it is. Three of them
are other names for Lab keys and are resolved when a spec is validated: ``checkpoint_id``
becomes ``init_from``, ``checkpoints.keep_cloud`` becomes ``checkpoints.keep_last`` and the
deprecated ``eval.eval_base_model`` becomes ``eval.skip_first_step`` (inverted); the
deprecated ``max_async_level`` fills ``max_off_policy_steps`` when that is absent. Which
keys Lab acts on, and which it only stores, is :mod:`labsdk.spec.warnings`' business.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from labsdk.spec.problems import SpecProblem
from labsdk.spec.values import (
    JsonDocument,
    JsonLike,
    JsonObject,
    MetadataKey,
    MetadataValue,
    Text,
    _check_json_like,
    _check_text,
    _printable,
    _text_problem,
)

#: Keys whose value Lab stores but never acts on, as dotted paths (each one is a warning).
PRIME_UNUSED_KEYS: tuple[str, ...] = (
    "cluster_name",
    "run_config",
    "wandb",
    "infrastructure",
    "tailscale",
    "env_file",
    "env_files",
    "trajectory_strategy",
    "buffer",
)

#: An environment id: built-in ``lab/<name>`` or uploaded ``<organization>/<name>[@<version>]``.
ENV_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._+-]+)?$"
_VERSION_PATTERN = r"^[A-Za-z0-9._+-]+$"
#: Redacted value stored in place of a secret written into a spec (``tailscale.auth_key``).
REDACTED = "[redacted]"

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

ReasoningEffort = Literal["low", "medium", "high"]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
FilePath = Annotated[str, StringConstraints(min_length=1, max_length=4096), AfterValidator(_check_text)]


class _Section(BaseModel):
    """A spec section whose optional keys are left out of the canonical dict while unset.

    ``_keep_none`` names the fields that stay in the canonical dict as ``null`` (keys Lab's
    own readers index directly); every other field whose value is ``None`` is left out, so a
    stored spec holds only the optional keys that were given.
    """

    model_config = _STRICT
    _keep_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_absent(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in list(data):
                if data[name] is None and name not in self._keep_none and name in type(self).model_fields:
                    del data[name]
        return data


#: An ``[[env]] name``: one segment of a metric name (letters, digits, ``.``, ``_``, ``-``).
ENV_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def _raise_at(subpath: str, code: str, message: str) -> None:
    """Raise a validation error for the key ``subpath`` inside the section being validated."""
    raise PydanticCustomError(code, message, {"subpath": subpath})


class TemperatureScheduleConfig(_Section):
    """A temperature that moves from ``start_temperature`` to ``end_temperature``
    over ``total_steps`` steps (default ``max_steps``), linearly or along half a cosine."""

    type: Literal["linear", "cosine"] = Field("linear", description="Shape of the schedule.")
    start_temperature: Temperature = Field(description="Temperature at step 1.")
    end_temperature: Temperature = Field(description="Temperature from step total_steps on.")
    total_steps: int | None = Field(
        None, ge=1, le=100_000, description="Steps the schedule takes; at most max_steps (default max_steps).",
    )


def _extra_body_field() -> Any:
    return Field(None, description="Extra fields for the inference request (OpenAI-compatible body).")


def _enable_thinking_field() -> Any:
    return Field(
        None, description="Thinking on or off through the chat template; exclusive with reasoning_effort.",
    )


def _reasoning_effort_field() -> Any:
    return Field(
        None, description='"low", "medium" or "high" (GPT-OSS style); exclusive with enable_thinking.',
    )


#: The keys of ``extra_body`` that Lab's engine passes to vLLM's ``SamplingParams`` (vLLM
#: 0.32.0, ``vllm/sampling_params.py``); the engine sets the others itself (``n``,
#: ``temperature``, ``max_tokens``, ``seed``, ``logprobs``, ``stop_token_ids``) or cannot
#: honour them on token ids (``stop`` and ``bad_words`` are strings; vLLM runs without a tokenizer).
VLLM_SAMPLING_KEYS: frozenset[str] = frozenset({
    "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "min_tokens", "ignore_eos", "logit_bias", "allowed_token_ids",
})
#: The ``extra_body`` key whose table goes to the chat template, as vLLM's server reads it.
CHAT_TEMPLATE_KWARGS_KEY = "chat_template_kwargs"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: What each key Lab passes on accepts (vLLM's own checks, ``SamplingParams._verify_args``).
_SAMPLING_KEY_CHECKS: dict[str, tuple[Any, str]] = {
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: _integer(v) and v >= -1, "an integer, -1 or 0 (off) or at least 1"),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "presence_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number in [-2, 2]"),
    "repetition_penalty": (lambda v: _number(v) and 0 < v <= 10, "a number in (0, 10]"),
    "min_tokens": (lambda v: _integer(v) and 0 <= v <= 131_072, "an integer of at least 0"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "logit_bias": (
        lambda v: isinstance(v, Mapping) and all(str(k).isdigit() and _number(b) and -100 <= b <= 100 for k, b in v.items()),
        "a table of token id -> bias in [-100, 100]",
    ),
    "allowed_token_ids": (
        lambda v: isinstance(v, list) and bool(v) and all(_integer(t) and t >= 0 for t in v),
        "a non-empty list of token ids",
    ),
    CHAT_TEMPLATE_KWARGS_KEY: (lambda v: isinstance(v, Mapping), "a table of chat template arguments"),
}


class _ReasoningControls(_Section):
    """A sampling section with Prime's two reasoning controls, which exclude each other."""

    def sampling_params(self) -> dict[str, Any]:
        """Return the keys of ``extra_body`` that go to vLLM's ``SamplingParams``
        (:data:`VLLM_SAMPLING_KEYS`), as given."""
        body = getattr(self, "extra_body", None) or {}
        params = {key: value for key, value in body.items() if key in VLLM_SAMPLING_KEYS}
        if "logit_bias" in params:  # a TOML or JSON table's keys are strings; vLLM's are token ids
            params["logit_bias"] = {int(token): bias for token, bias in params["logit_bias"].items()}
        return params

    def chat_template_kwargs(self) -> dict[str, Any]:
        """Return the keyword arguments for the chat template: ``extra_body.chat_template_kwargs``
        (a table), then ``enable_thinking`` or ``reasoning_effort`` when given."""
        body = getattr(self, "extra_body", None) or {}
        kwargs = dict(body.get(CHAT_TEMPLATE_KWARGS_KEY) or {}) if isinstance(body.get(CHAT_TEMPLATE_KWARGS_KEY), Mapping) else {}
        for name in ("enable_thinking", "reasoning_effort"):
            if getattr(self, name, None) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs

    def unknown_extra_body_keys(self) -> list[str]:
        """Return the keys of ``extra_body`` that Lab passes nowhere, in order."""
        body = getattr(self, "extra_body", None) or {}
        return [key for key in body if key not in VLLM_SAMPLING_KEYS and key != CHAT_TEMPLATE_KWARGS_KEY]

    @model_validator(mode="after")
    def _one_reasoning_control(self) -> _ReasoningControls:
        if getattr(self, "enable_thinking", None) is not None and getattr(self, "reasoning_effort", None) is not None:
            _raise_at(
                "reasoning_effort", "conflicting_keys",
                "enable_thinking and reasoning_effort cannot both be set; keep one",
            )
        body = getattr(self, "extra_body", None) or {}
        for key, value in body.items():
            check = _SAMPLING_KEY_CHECKS.get(key)
            if check is not None and not check[0](value):
                _raise_at(f"extra_body.{key}", "invalid_value", f"must be {check[1]}")
        return self


class SamplingConfig(_ReasoningControls):
    """How rollouts are sampled from the policy."""

    max_tokens: int = Field(
        128, ge=1, le=131_072,
        description="Most tokens generated per completion; must fit the model's context.",
    )
    temperature: Temperature = Field(1.0, description="Sampling temperature.")
    temp_scheduler: TemperatureScheduleConfig | None = Field(
        None, description="A temperature schedule over the steps instead of one temperature.",
    )
    extra_body: JsonObject | None = _extra_body_field()
    enable_thinking: bool | None = _enable_thinking_field()
    reasoning_effort: ReasoningEffort | None = _reasoning_effort_field()

    def temperature_at(self, step: int, max_steps: int) -> float:
        """Return the sampling temperature of training step ``step`` (1-based) of ``max_steps``.

        Without ``temp_scheduler``: ``temperature``. With one, the schedule runs from
        ``start_temperature`` at step 1 to ``end_temperature`` at step ``total_steps`` (default
        ``max_steps``) and stays there: progress ``p = (step - 1) / (total_steps - 1)`` clamped
        to [0, 1]; linear ``start + (end - start) * p``; cosine ``end + (start - end) *
        (1 + cos(pi * p)) / 2`` (the half-cosine of cosine annealing, Loshchilov & Hutter,
        "SGDR", ICLR 2017).
        """
        schedule = self.temp_scheduler
        if schedule is None:
            return self.temperature
        total = schedule.total_steps or max_steps
        progress = 1.0 if total <= 1 else min(max((step - 1) / (total - 1), 0.0), 1.0)
        start, end = schedule.start_temperature, schedule.end_temperature
        if schedule.type == "cosine":
            return end + (start - end) * (1.0 + math.cos(math.pi * progress)) / 2.0
        return start + (end - start) * progress


class TeacherSamplingConfig(_ReasoningControls):
    """How the teacher's completions are sampled (``loss = "sft"``)."""

    max_tokens: int | None = Field(None, ge=1, le=131_072, description="Most tokens per teacher completion.")
    temperature: Temperature | None = Field(None, description="Teacher sampling temperature.")
    extra_body: JsonObject | None = _extra_body_field()
    enable_thinking: bool | None = _enable_thinking_field()
    reasoning_effort: ReasoningEffort | None = _reasoning_effort_field()


class EvalSamplingConfig(TeacherSamplingConfig):
    """Sampling overrides for eval rollouts."""


class TeacherClientConfig(_Section):
    """An OpenAI-compatible endpoint serving the teacher model."""

    base_url: Text | None = Field(
        None, min_length=1, max_length=2048,
        description="Endpoint base URL, e.g. https://host/v1 (required unless [teacher] names a deployment).",
    )
    api_key_var: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the job secret holding the endpoint's API key.",
    )
    headers_from_env: dict[Annotated[str, StringConstraints(min_length=1, max_length=128)], str] | None = Field(
        None, max_length=16, description="HTTP header name -> name of the job secret holding its value.",
    )
    skip_model_check: bool | None = Field(None, description="Do not ask the endpoint whether it serves the model.")

    @model_validator(mode="after")
    def _check_endpoint(self) -> TeacherClientConfig:
        # The engine sends these as they are (engine/distill.py): a URL httpx cannot ask or a
        # header it cannot send would fail every attempt as a network error, so it is a 400 here.
        match = _HTTP_URL.fullmatch(self.base_url) if self.base_url is not None else None
        if self.base_url is not None and (match is None or not match.group("host")):
            _raise_at("base_url", "invalid_value", "must be an http:// or https:// URL with a host, e.g. https://host/v1")
        seen: set[str] = set()
        for header in self.headers_from_env or {}:
            if _HEADER_NAME.fullmatch(header) is None:
                _raise_at(
                    f"headers_from_env.{_printable(header)}", "invalid_value",
                    "is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)",
                )
            if header.lower() in _RESERVED_HEADERS:
                _raise_at(
                    f"headers_from_env.{header}", "invalid_value",
                    f"is a header the engine sets itself ({', '.join(sorted(_RESERVED_HEADERS))}); "
                    "the API key goes in api_key_var",
                )
            if header.lower() in seen:
                _raise_at(f"headers_from_env.{header}", "duplicate_key", "names a header already given in another case")
            seen.add(header.lower())
        return self


#: An absolute http(s) URL without whitespace or control characters; ``host`` may be empty
#: (``http:///v1``), which the validator refuses.
_HTTP_URL = re.compile(r"https?://(?P<host>[^/?#@\s\x00-\x1f\x7f]*)(?:[/?#][^\s\x00-\x1f\x7f]*)?", re.IGNORECASE)
#: A header field name: RFC 9110 section 5.1 ``token``.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Headers the engine's HTTP client sets itself (lower case): the key, the target and the framing.
_RESERVED_HEADERS = frozenset({"authorization", "host", "content-length", "content-type", "transfer-encoding", "connection"})


#: The teacher endpoint of a ``[teacher]`` without ``[teacher.client]``: Prime Inference, as in Prime.
PRIME_INFERENCE_BASE_URL = "https://api.pinference.ai/api/v1"
#: The job secret holding Prime Inference's API key (Prime's own variable name).
PRIME_API_KEY_VAR = "PRIME_API_KEY"


@dataclass(frozen=True)
class TeacherEndpoint:
    """Where a teacher is asked: the endpoint's base URL and the job secrets it needs
    (``api_key_var`` for ``Authorization``, ``headers_from_env`` header name -> secret name)."""

    base_url: str
    api_key_var: str
    headers_from_env: dict[str, str]
    check_model: bool


#: A deployment's public id (``dep_...``), as a ``[teacher]`` or an ``[[env]] judge`` names it.
DEPLOYMENT_ID_PATTERN = r"^dep_[A-Za-z0-9]{1,64}$"


class TeacherConfig(_Section):
    """The teacher of a distillation job (``loss = "sft"``): a model at an OpenAI-compatible
    endpoint, or one of the project's deployments (``deployment``), which Lab resolves at submit
    to its own OpenAI-compatible API (``model`` = the deployment's name, ``client.base_url`` =
    Lab's ``/api/v1/openai/v1``) with the Lab API key in the job secret ``client.api_key_var``."""

    model: Text | None = Field(
        None, min_length=1, max_length=256,
        description="Model id the teacher endpoint serves (required unless deployment is given).",
    )
    deployment: str | None = Field(
        None, max_length=68, pattern=DEPLOYMENT_ID_PATTERN,
        description="A deployment of the project (dep_...) to distil from, through Lab's OpenAI-compatible API; "
        "its Lab API key is the job secret [teacher.client] api_key_var.",
    )
    client: TeacherClientConfig | None = Field(None, description="The endpoint; default Prime Inference.")
    sampling: TeacherSamplingConfig | None = Field(None, description="Teacher sampling settings.")

    @model_validator(mode="after")
    def _model_or_deployment(self) -> TeacherConfig:
        if self.deployment is not None:
            if self.client is None:
                _raise_at(
                    "client.api_key_var", "required",
                    "a teacher deployment needs [teacher.client] api_key_var: the job secret holding a Lab API key",
                )
            return self
        if self.model is None:
            _raise_at("model", "required", "'model' is required (or a deployment = \"dep_...\")")
        if self.client is not None and self.client.base_url is None:
            _raise_at("client.base_url", "required", "'base_url' is required (or [teacher] deployment = \"dep_...\")")
        return self

    def endpoint(self) -> TeacherEndpoint:
        """Return the endpoint this teacher is asked at: ``[teacher.client]``, else Prime Inference
        with the secret ``PRIME_API_KEY``. A deployment's base URL is ``""`` until Lab resolves it
        at submit (every stored spec has it resolved)."""
        client = self.client
        if client is None:
            return TeacherEndpoint(PRIME_INFERENCE_BASE_URL, PRIME_API_KEY_VAR, {}, True)
        return TeacherEndpoint(
            client.base_url or "", client.api_key_var, dict(client.headers_from_env or {}), not client.skip_model_check,
        )


#: The ``args`` an ``[[env]] judge`` is resolved into: Prime's environments' judge arguments.
JUDGE_ARGS = ("judge_model", "judge_base_url", "judge_api_key_var")


class EnvJudgeConfig(_Section):
    """The judge of an environment that takes Prime's judge arguments (``judge_model``,
    ``judge_base_url``, ``judge_api_key_var``), which Lab sets at submit: one of the project's
    deployments (``deployment``), or an OpenAI-compatible endpoint the job declares
    (``base_url``, with ``model`` and ``api_key_var`` when given). A declared endpoint is the
    one the job's network lets the environment reach (docs/environments.md "Network")."""

    deployment: str | None = Field(
        None, max_length=68, pattern=DEPLOYMENT_ID_PATTERN, description="A deployment of the project (dep_...) that judges.",
    )
    base_url: Text | None = Field(
        None, min_length=1, max_length=2048,
        description="An OpenAI-compatible endpoint that judges, e.g. https://host/v1: the judge_base_url arg, "
        "and the judge endpoint the job's network allows.",
    )
    model: Text | None = Field(
        None, min_length=1, max_length=256, description="The judge_model arg: the model the endpoint serves.",
    )
    api_key_var: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The judge_api_key_var arg: the job secret holding the endpoint's API key "
        "(a Lab API key of the project for a deployment; required then).",
    )

    @model_validator(mode="after")
    def _deployment_or_endpoint(self) -> EnvJudgeConfig:
        if (self.deployment is None) == (self.base_url is None):
            _raise_at("base_url", "required", 'give one of deployment = "dep_..." or base_url = "https://host/v1"')
        if self.deployment is not None:
            if self.model is not None:
                _raise_at("model", "conflicting_keys", "a deployment's model is its name, which Lab sets; leave model out")
            if self.api_key_var is None:
                _raise_at(
                    "api_key_var", "required", "a judge deployment needs api_key_var: the job secret holding a Lab API key",
                )
            return self
        match = _HTTP_URL.fullmatch(self.base_url)
        if match is None or not match.group("host"):
            _raise_at("base_url", "invalid_value", "must be an http:// or https:// URL with a host, e.g. https://host/v1")
        return self

    def declared_args(self) -> dict[str, str]:
        """Return the ``args`` a declared endpoint (``base_url``) sets: ``judge_base_url``, and
        ``judge_model`` and ``judge_api_key_var`` when given; empty for a deployment, which Lab
        resolves at submit."""
        if self.base_url is None:
            return {}
        given = zip(JUDGE_ARGS, (self.model, self.base_url, self.api_key_var), strict=True)
        return {name: value for name, value in given if value is not None}


class EnvConfig(_Section):
    """One training environment: Prime's legacy form (``id``, ``args``, ``version``,
    ``max_retries``) or its v1 form (``name``, ``taskset``, ``harness``, ``ratio``, ...).

    A v1 block without ``id`` takes its id from ``taskset.id``; a separate ``version`` is
    folded into the id as ``<id>@<version>``, Lab's spelling.
    """

    _keep_none = frozenset({"id"})

    id: str | None = Field(
        None, min_length=1, max_length=128, pattern=ENV_ID_PATTERN,
        description='Environment id: built-in "lab/<name>" or uploaded '
        '"<organization slug>/<name>[@<version>]".',
    )
    args: JsonObject = Field(
        default_factory=dict,
        description="Keyword arguments for the environment; keys and JSON types must match "
        "the environment's defaults.",
    )
    version: str | None = Field(
        None, min_length=1, max_length=64, pattern=_VERSION_PATTERN,
        description="Environment version; the same as writing id@version.",
    )
    name: str | None = Field(
        None, min_length=1, max_length=64, pattern=ENV_NAME_PATTERN,
        description="Name of this block in metric names (reward/<name>/mean), unique among the blocks; "
        "default: the environment's name.",
    )
    max_retries: int | None = Field(
        None, ge=0, le=100, description="Times a rollout whose environment code failed is run again (legacy name of retries).",
    )
    taskset: JsonObject | None = Field(
        None, description="v1 form: the taskset, {id = ..., ...}.", json_schema_extra={"required": ["id"]},
    )
    harness: JsonObject | None = Field(
        None, description='v1 form: the harness, {id = ..., runtime = {type = "subprocess"}}.',
    )
    ratio: float | None = Field(None, gt=0.0, le=1_000_000.0, description="Share of each batch from this environment.")
    group_size: int | None = Field(
        None, ge=1, le=256,
        description="Rollouts per example (GRPO group size) for this environment.",
    )
    max_turns: int | None = Field(None, ge=1, le=10_000, description="Most turns of each agent of a multi-turn episode.")
    max_input_tokens: int | None = Field(
        None, ge=1, le=1_048_576,
        description="Most tokens fed in to each agent of a multi-turn episode (checked between turns).",
    )
    max_output_tokens: int | None = Field(
        None, ge=1, le=131_072,
        description="Most tokens each agent of a multi-turn episode samples (checked between turns).",
    )
    timeout: float | None = Field(
        None, gt=0.0, le=86_400.0,
        description="Seconds the environment's part of a rollout may take: a multi-turn verifiers episode "
        "(verifiers' episode deadline) or a verifiers taskset's scoring; past it the rollout counts as timed out.",
    )
    retries: int | None = Field(
        None, ge=0, le=100,
        description="Times a rollout whose environment code failed is run again before the job fails (default 0).",
    )
    judge: EnvJudgeConfig | None = Field(
        None, description="A deployment of the project as the environment's judge (judge_model, judge_base_url and "
        "judge_api_key_var args, set by Lab at submit).",
    )

    @property
    def rollout_retries(self) -> int:
        """How many times a rollout whose environment code failed is run again: ``retries``,
        else Prime's legacy ``max_retries``, else 0."""
        return self.retries if self.retries is not None else self.max_retries or 0

    @model_validator(mode="after")
    def _resolve_id(self) -> EnvConfig:
        if self.retries is not None and self.max_retries is not None and self.retries != self.max_retries:
            _raise_at(
                "retries", "conflicting_keys",
                f"retries ({self.retries}) and max_retries ({self.max_retries}) are the same setting; give one",
            )
        if self.id is None:
            taskset_id = self.taskset.get("id") if self.taskset else None
            if taskset_id is None:
                _raise_at("id", "required", "'id' is required (or a v1 taskset = {id = ...})")
            if not isinstance(taskset_id, str) or not re.match(ENV_ID_PATTERN, taskset_id):
                _raise_at(
                    "taskset.id", "invalid_value",
                    'must be an environment id like "lab/addition" or "owner/name@version"',
                )
            self.id = taskset_id
        if self.version is not None:
            if "@" in self.id and self.id.rsplit("@", 1)[1] != self.version:
                _raise_at(
                    "version", "conflicting_keys",
                    f"version '{self.version}' differs from the version in id '{self.id}'; give one",
                )
            if "@" not in self.id:
                if len(self.id) + 1 + len(self.version) > 128:
                    _raise_at("version", "too_long", "id@version would be longer than 128 characters")
                self.id = f"{self.id}@{self.version}"
            self.version = None
        return self


#: The argument of an ``[[eval.env]]`` block that Lab leaves out when the environment does not take it.
EVAL_SPLIT_ARG = "split"


class EvalEnvConfig(EnvConfig):
    """An environment evaluated (not trained on), with its own example count and group size
    (``rollouts_per_example``, or ``group_size`` as in ``[[env]]``; not both)."""

    num_examples: int | None = Field(None, ge=-1, le=10_000, description="Examples; -1 = all.")
    rollouts_per_example: int | None = Field(None, ge=1, le=256, description="Rollouts per eval example.")

    def environment_args(self, accepted: Collection[str]) -> dict[str, Any]:
        """Return the args the environment is loaded with: ``args`` without a ``split`` key
        that the environment does not take (``accepted``: its argument names). Prime's eval
        environments often choose a dataset split so; Lab evaluates every environment on its
        own eval split, held out from training."""
        return {key: value for key, value in self.args.items() if key != EVAL_SPLIT_ARG or key in accepted}

    @model_validator(mode="after")
    def _one_group_size(self) -> EvalEnvConfig:
        if self.rollouts_per_example is not None and self.group_size is not None:
            _raise_at(
                "group_size", "conflicting_keys",
                "group_size and rollouts_per_example are the same setting for an eval environment; give one",
            )
        return self


def _refuse_zero(value: int | None, key: str) -> None:
    if value == 0:
        _raise_at(key, "out_of_range", "must be -1 (all) or at least 1")


class EvalEndpointConfig(_Section):
    """An OpenAI-compatible endpoint an evaluation job samples through (``POST {base_url}/chat/completions``)."""

    base_url: Text = Field(min_length=1, max_length=2048, description="Endpoint base URL, e.g. https://host/v1.")
    model: Text = Field(min_length=1, max_length=256, description="Model id the endpoint serves.")
    api_key_var: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the job secret holding the endpoint's API key.",
    )

    @model_validator(mode="after")
    def _check_url(self) -> EvalEndpointConfig:
        match = _HTTP_URL.fullmatch(self.base_url)
        if match is None or not match.group("host"):
            _raise_at("base_url", "invalid_value", "must be an http:// or https:// URL with a host, e.g. https://host/v1")
        return self


class EvalConfig(_Section):
    """Periodic evaluation on held-out examples."""

    interval: int = Field(0, ge=0, le=100_000, description="Steps between evals; 0 = never.")
    num_examples: int = Field(32, ge=-1, le=10_000, description="Examples per eval; -1 = the whole eval split.")
    rollouts_per_example: int | None = Field(None, ge=1, le=256, description="Rollouts per eval example.")
    skip_first_step: bool | None = Field(None, description="Skip the eval of the base model before step 1.")
    eval_base_model: bool | None = Field(
        None, description="Deprecated: the inverse of skip_first_step.",
    )
    sampling: EvalSamplingConfig | None = Field(None, description="Sampling overrides for eval rollouts.")
    env: list[EvalEnvConfig] | None = Field(
        None, max_length=16, description="Environments to evaluate instead of the training ones.",
    )
    evaluate_final_checkpoint: bool | None = Field(
        None, description="When the job succeeds, evaluate its final checkpoint on these environments, examples, "
        "rollouts and sampling as an evaluation of its own, every sample kept (docs/evaluations.md).",
    )
    adapter: str | None = Field(
        None, max_length=64, pattern=r"^adp_[A-Za-z0-9]+$",
        description="Evaluation jobs (written by Lab from POST /evaluations): the ready adapter of this project "
        "whose weights are evaluated on the model.",
    )
    endpoint: EvalEndpointConfig | None = Field(
        None, description="Evaluation jobs (written by Lab from POST /evaluations): the OpenAI-compatible endpoint "
        "the evaluation samples through instead of the model.",
    )

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        _refuse_zero(self.num_examples, "num_examples")
        for index, env in enumerate(self.env or []):
            _refuse_zero(env.num_examples, f"env.{index}.num_examples")
        if self.adapter is not None and self.endpoint is not None:
            _raise_at("adapter", "conflicting_keys", "an evaluation samples an adapter or an endpoint, not both")
        if self.eval_base_model is not None:
            if self.skip_first_step is None:
                self.skip_first_step = not self.eval_base_model
            self.eval_base_model = None
        return self

    @property
    def evaluates_base_model(self) -> bool:
        """Whether the base model is evaluated before step 1 (reported as step 0): when evals
        run at all (``interval`` > 0) and ``skip_first_step`` is not true, as in Prime."""
        return bool(self.interval) and not self.skip_first_step


#: What ``[val]`` does for a key it leaves out.
VAL_DEFAULTS = {"num_examples": 32, "rollouts_per_example": 1, "interval": 10}


class ValConfig(_Section):
    """Validation on held-out examples of the training environments (their "val" split,
    disjoint from train and eval); a key left out takes its value in :data:`VAL_DEFAULTS`."""

    num_examples: int | None = Field(None, ge=1, le=10_000, description="Examples per validation (default 32).")
    rollouts_per_example: int | None = Field(None, ge=1, le=256, description="Rollouts per example (default 1).")
    interval: int | None = Field(None, ge=0, le=100_000, description="Steps between validations; 0 = never (default 10).")

    def setting(self, name: str) -> int:
        """Return ``name``'s value, or its default from :data:`VAL_DEFAULTS` when not given."""
        value = getattr(self, name)
        return VAL_DEFAULTS[name] if value is None else value


#: The settings of each rollout filter type and their defaults (docs/spec.md defines them):
#: gibberish flags a completion whose mean sampled-token log-probability (nats, under the
#: sampling distribution) is below ``min_mean_logprob``, or whose decoded text is more than
#: ``max_nonprintable_fraction`` non-printable characters; repetition flags one in which an
#: n-gram of ``ngram_size`` tokens occurs more than ``max_repeats`` times; zero_advantage flags
#: every rollout of a group whose rewards are all equal (spread below ``tolerance``).
FILTER_SETTINGS: dict[str, dict[str, float | int]] = {
    "zero_advantage": {"tolerance": 1e-6},
    "gibberish": {"min_mean_logprob": -6.0, "max_nonprintable_fraction": 0.5},
    "repetition": {"ngram_size": 4, "max_repeats": 8},
}
#: Bounds of each setting: (kind, lowest, highest).
_FILTER_SETTING_BOUNDS: dict[str, tuple[type, float, float]] = {
    "tolerance": (float, 0.0, 1e6),
    "min_mean_logprob": (float, -1e6, 0.0),
    "max_nonprintable_fraction": (float, 0.0, 1.0),
    "ngram_size": (int, 1, 64),
    "max_repeats": (int, 1, 100_000),
}


class BatchFilterConfig(_Section):
    """A rollout filter of ``[[pre_batch_filters]]`` or ``[[post_batch_filters]]``; keys
    other than ``type`` and ``enforce`` are the filter's own settings, kept as given."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    type: Literal["zero_advantage", "gibberish", "repetition"] = Field(description="What the filter flags.")
    enforce: bool | None = Field(None, description="Drop flagged rollouts (default) or only count them (false).")

    @model_validator(mode="after")
    def _check_settings(self) -> BatchFilterConfig:
        extra = self.model_extra or {}
        if len(extra) > 32:
            _raise_at("", "too_long", "a filter takes at most 32 settings")
        for key, value in extra.items():
            problem = _text_problem(key)
            if problem:
                # The key is stored with the spec (jsonb cannot hold NUL); _check_json_like checks values only here.
                _raise_at(_printable(key), "invalid_value", "key " + problem)
            try:
                _check_json_like(value)
            except PydanticCustomError as exc:
                subpath = ".".join(part for part in (key, (exc.context or {}).get("subpath", "")) if part)
                raise PydanticCustomError(exc.type, exc.message(), {"subpath": subpath}) from None
            if key in FILTER_SETTINGS[self.type]:
                kind, lowest, highest = _FILTER_SETTING_BOUNDS[key]
                number = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
                if not number:
                    _raise_at(key, "invalid_type", f"must be {'a number' if kind is float else 'an integer'}")
                if not lowest <= value <= highest:
                    _raise_at(key, "out_of_range", f"must be between {lowest:g} and {highest:g}")
        return self

    @property
    def enforced(self) -> bool:
        """Whether flagged rollouts are dropped (``enforce`` true or left out) or only counted."""
        return self.enforce is not False

    def settings(self) -> dict[str, float | int]:
        """Return this filter's settings: :data:`FILTER_SETTINGS` defaults, overridden by the
        keys given; keys that are not one of its type's settings are left out (a warning
        names them)."""
        given = self.model_extra or {}
        return {name: given.get(name, default) for name, default in FILTER_SETTINGS[self.type].items()}

    def unknown_settings(self) -> list[str]:
        """Return the given keys that are not settings of this filter's type, in order."""
        return [key for key in (self.model_extra or {}) if key not in FILTER_SETTINGS[self.type]]


#: The filters of a slot whose key is left out: one enforced zero_advantage filter before
#: advantages (a group whose rewards are all equal carries no signal), none after.
DEFAULT_BATCH_FILTERS: dict[str, tuple[dict[str, Any], ...]] = {
    "pre_batch_filters": ({"type": "zero_advantage"},),
    "post_batch_filters": (),
}


class CheckpointsConfig(_Section):
    """When checkpoints are written and how many are kept."""

    interval: int = Field(
        10, ge=0, le=100_000,
        description="Steps between checkpoints; 0 = only the final one.",
    )
    keep_last: int = Field(3, ge=-1, le=100, description="Ready checkpoints kept per job; -1 = all.")
    keep_cloud: int | None = Field(None, ge=-1, le=100, description="Prime's name for keep_last.")

    @model_validator(mode="after")
    def _resolve_keep_cloud(self) -> CheckpointsConfig:
        if self.keep_cloud is not None and "keep_last" in self.model_fields_set:
            _raise_at(
                "keep_cloud", "conflicting_keys",
                "keep_cloud and keep_last are the same setting; give one",
            )
        _refuse_zero(self.keep_cloud, "keep_cloud")
        _refuse_zero(self.keep_last, "keep_last")
        if self.keep_cloud is not None:
            self.keep_last, self.keep_cloud = self.keep_cloud, None
        return self


class AdaptersConfig(_Section):
    """Adapter artifacts: the trained weights alone, without optimizer state."""

    interval: int | None = Field(None, ge=0, le=100_000, description="Steps between adapters; 0 = only at the end.")
    keep_last: int | None = Field(None, ge=-1, le=100, description="Adapters kept; -1 = all.")

    @model_validator(mode="after")
    def _check(self) -> AdaptersConfig:
        _refuse_zero(self.keep_last, "keep_last")  # keeping none would delete each one once ready
        return self


class ResourcesConfig(_Section):
    """What the job runs on."""

    _keep_none = frozenset({"gpus"})

    gpu_type: str = Field(
        "cpu", min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description='"cpu" for local runs, or a GPU type the pool has ("H100", "H200", ...).',
    )
    gpus: int | None = Field(
        None, ge=0, le=64,
        description="GPUs per job; default 0 on cpu, num_train_gpus + num_infer_gpus when both are given, else 1.",
    )
    num_train_gpus: int | None = Field(
        None, ge=1, le=64,
        description="Of gpus (2 or more), the trainer's: data-parallel ranks under torchrun; default the smaller half.",
    )
    num_infer_gpus: int | None = Field(
        None, ge=1, le=64,
        description="Of gpus (2 or more), the inference server's: vLLM's tensor-parallel size; default the larger half.",
    )

    @model_validator(mode="after")
    def _default_gpus(self) -> ResourcesConfig:
        if self.gpus is None:
            both = self.num_train_gpus is not None and self.num_infer_gpus is not None
            self.gpus = 0 if self.gpu_type == "cpu" else self.num_train_gpus + self.num_infer_gpus if both else 1
        return self

    def gpu_split(self) -> tuple[int, int]:
        """Return ``(trainer GPUs, inference GPUs)`` of a job whose trainer and inference server
        run apart: ``num_train_gpus`` and ``num_infer_gpus`` as given (one given, the other
        takes the rest of ``gpus``), else the inference server the larger half
        (``ceil(gpus / 2)``: sampling is most of a step) and the trainer the rest. ``(0, 0)``
        for a CPU job; a 1-GPU job's engine shares its GPU, ``(1, 1)``. The validated spec's
        two add up to ``gpus`` whenever it is 2 or more (:func:`_gpu_split_problems`)."""
        gpus = self.gpus or 0
        if self.gpu_type == "cpu" or gpus == 0:
            return 0, 0
        if gpus == 1:
            return 1, 1
        train, infer = self.num_train_gpus, self.num_infer_gpus
        if train is None and infer is None:
            infer = (gpus + 1) // 2
        if train is None:
            train = gpus - infer
        return train, gpus - train if infer is None else infer


class TranslatedFrom(_Section):
    """The config a spec was translated from, as submitted (another layout than Lab's)."""

    layout: Literal["prime-rl", "prime-cli-v0"] = Field(
        description='"prime-rl": prime-rl\'s native tables; "prime-cli-v0": the older prime CLI form.',
    )
    config: JsonDocument = Field(description="The config as submitted.")


class JobSpec(_Section):
    """A training job: base model, environments and GRPO settings (docs/spec.md).

    Only ``model`` and ``env`` are required. Durations are in minutes where the name says
    so, counts in steps, rollouts or tokens. Prime Intellect's keys are fields here, so
    they are validated and stored; :func:`parse_spec` says which ones Lab does not use.
    """

    _keep_none = frozenset({"name", "init_from"})

    name: Text | None = Field(None, min_length=1, max_length=128, description="Display name.")
    model: Text = Field(
        min_length=1, max_length=256, description="Model catalogue id (GET /api/v1/models)."
    )
    loss: Literal["rl", "sft", "opd"] = Field(
        "rl", description='"rl" (GRPO on the environments\' rewards) or "sft" (distillation from [teacher]).',
    )
    teacher: TeacherConfig | None = Field(None, description='The teacher of loss = "sft".')
    max_steps: int = Field(20, ge=1, le=100_000, description="Training steps.")
    batch_size: int = Field(32, ge=1, le=8192, description="Rollouts per step.")
    rollouts_per_example: int = Field(
        4, ge=1, le=256,
        description="GRPO group size; batch_size must be a multiple of it.",
    )
    max_inflight_rollouts: int | None = Field(
        None, ge=1, le=1_048_576,
        description="Most rollouts in flight at once; at least rollouts_per_example; exclusive with "
        "oversampling_factor.",
    )
    oversampling_factor: float | None = Field(
        None, gt=0.0, le=1000.0,
        description="Rollouts in flight as a multiple of batch_size; exclusive with max_inflight_rollouts.",
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
    max_async_level: int | None = Field(
        None, ge=0, le=16, description="Deprecated Prime name of max_off_policy_steps.",
    )
    priority: Literal["low", "normal", "high"] = Field("normal", description="Queue priority.")
    max_runtime_minutes: int = Field(
        600, ge=1, le=10_080, description="Wall-clock limit in minutes (at most a week)."
    )
    init_from: str | None = Field(
        None, max_length=64, pattern=r"^ckpt_[A-Za-z0-9]+$",
        description="Start from this ready checkpoint of the same project.",
    )
    checkpoint_id: str | None = Field(
        None, max_length=64, pattern=r"^ckpt_[A-Za-z0-9]+$", description="Prime's name for init_from.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    env: list[EnvConfig] = Field(min_length=1, max_length=16, description="Environments.")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    val: ValConfig | None = Field(None, description="Validation on held-out examples.")
    pre_batch_filters: list[BatchFilterConfig] | None = Field(
        None, max_length=8, description="Rollout filters applied before a rollout takes a batch slot.",
    )
    post_batch_filters: list[BatchFilterConfig] | None = Field(
        None, max_length=8, description="Rollout filters applied to a full batch.",
    )
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    adapters: AdaptersConfig | None = Field(None, description="Adapter artifacts.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=16,
        description="Up to 16 string pairs for filtering jobs (keys ≤ 64, values ≤ 512).",
    )

    cluster_name: Text | None = Field(None, max_length=256, description="Prime key, stored but not used by Lab.")
    run_config: JsonObject | None = Field(None, description="Prime key, stored but not used by Lab.")
    wandb: JsonObject | None = Field(None, description="Prime key, stored but not used by Lab.")
    infrastructure: JsonObject | None = Field(None, description="Prime key, stored but not used by Lab.")
    tailscale: JsonObject | None = Field(
        None, description="Prime key, stored but not used by Lab (auth_key is not stored).",
    )
    env_file: list[FilePath] | None = Field(
        None, max_length=16, description="Deprecated spelling of env_files.",
    )
    env_files: list[FilePath] | None = Field(
        None, max_length=16,
        description="Secrets files (KEY=VALUE lines) the CLI reads, relative to the spec file.",
    )
    trajectory_strategy: JsonLike = Field(None, description="Deprecated Prime key, stored but not used.")
    buffer: JsonObject | None = Field(
        None, description="Deprecated Prime key (the difficulty buffer), stored but not used.",
    )
    translated_from: TranslatedFrom | None = Field(
        None, description="The config this spec was translated from, when it came in another layout.",
    )

    def batch_filters(self, slot: Literal["pre_batch_filters", "post_batch_filters"]) -> list[BatchFilterConfig]:
        """Return the filters of ``slot``: the given list (an empty one turns the slot off), or
        :data:`DEFAULT_BATCH_FILTERS` when the key was left out."""
        given = getattr(self, slot)
        if given is not None:
            return list(given)
        return [BatchFilterConfig.model_validate(data) for data in DEFAULT_BATCH_FILTERS[slot]]

    @model_validator(mode="after")
    def _check_cross_field(self) -> JobSpec:
        problems = _cross_field_problems(self.model_dump(exclude_unset=True), set())
        if problems:
            first = problems[0]
            raise PydanticCustomError(first.code, first.message, {"param": first.param})
        if self.checkpoint_id is not None:
            self.init_from, self.checkpoint_id = self.checkpoint_id, None
        if self.max_async_level is not None and "max_off_policy_steps" not in self.model_fields_set:
            self.max_off_policy_steps = self.max_async_level
        if self.tailscale and self.tailscale.get("auth_key") not in (None, REDACTED):
            self.tailscale = {**self.tailscale, "auth_key": REDACTED}
        return self


def _cross_field_problems(data: Mapping[str, Any], bad_params: set[str]) -> list[SpecProblem]:
    """Check rules spanning several fields on raw data (keys present = keys given), skipping
    fields already refused."""
    problems: list[SpecProblem] = []

    def plain_int(name: str) -> int | None:
        if name in bad_params:
            return None
        value = data.get(name, JobSpec.model_fields[name].default)
        return None if isinstance(value, bool) or not isinstance(value, int) else value

    def given(name: str) -> bool:
        return data.get(name) is not None and name not in bad_params

    batch_size = plain_int("batch_size")
    group_size = plain_int("rollouts_per_example")
    # [[env]] group_size: a block's own rollouts per example (the others take rollouts_per_example).
    blocks = data.get("env") if isinstance(data.get("env"), list) else []
    own_sizes: dict[int, int] = {}  # the blocks that give a valid group_size
    given_sizes: set[int] = set()  # the blocks that give one at all
    for index, block in enumerate(blocks):
        size = block.get("group_size") if isinstance(block, Mapping) else None
        if size is not None:
            given_sizes.add(index)
        if isinstance(size, int) and not isinstance(size, bool) and f"env.{index}.group_size" not in bad_params:
            own_sizes[index] = size
    if batch_size and group_size and batch_size % group_size and len(given_sizes) < len(blocks or [None]):
        problems.append(SpecProblem(
            "batch_size", "not_divisible",
            f"batch_size ({batch_size}) must be a multiple of rollouts_per_example "
            f"({group_size}): each step trains on whole groups",
        ))
    for index, size in own_sizes.items():
        if batch_size and batch_size % size:
            problems.append(SpecProblem(
                f"env.{index}.group_size", "not_divisible",
                f"batch_size ({batch_size}) must be a multiple of this block's group_size ({size}): "
                "each step trains on whole groups",
            ))
    sizes = {index: own_sizes.get(index, group_size) for index in range(len(blocks)) if index in own_sizes or index not in given_sizes}
    if own_sizes and group_size and len(set(sizes.values())) > 1:
        smallest_index = min(sizes, key=lambda index: (sizes[index], index))
        smallest = sizes[smallest_index]
        for index, size in sizes.items():
            if size % smallest:
                at = index if index in own_sizes else smallest_index
                problems.append(SpecProblem(
                    f"env.{at}.group_size", "not_divisible",
                    f"the [[env]] blocks' group sizes ({', '.join(str(sizes[i]) for i in sorted(sizes))}) must each be a "
                    f"multiple of the smallest ({smallest}), so that every step can be filled with whole groups",
                ))
                break

    evaluation = data.get("eval")
    for section, blocks in (("env", data.get("env")), ("eval.env", evaluation.get("env") if isinstance(evaluation, Mapping) else None)):
        seen: set[str] = set()
        for index, block in enumerate(blocks if isinstance(blocks, list) else []):
            name = block.get("name") if isinstance(block, Mapping) else None
            if not isinstance(name, str) or f"{section}.{index}.name" in bad_params:
                continue
            if name in seen:
                problems.append(SpecProblem(
                    f"{section}.{index}.name", "duplicate_name",
                    f"another [[{section}]] block is named '{name}'; each block's name must be unique "
                    "(it names the block's metrics)",
                ))
            seen.add(name)

    if given("checkpoint_id") and given("init_from"):
        problems.append(SpecProblem(
            "checkpoint_id", "conflicting_keys",
            "checkpoint_id and init_from are the same setting (the checkpoint to start from); give one",
        ))

    loss = data.get("loss", "rl") if "loss" not in bad_params else None
    if loss == "opd":
        problems.append(SpecProblem(
            "loss", "invalid_value",
            'loss = "opd" (on-policy distillation) is not supported: it needs the teacher\'s '
            'log-probabilities of the policy\'s tokens, which hosted teachers do not give; '
            'use "rl" or "sft"',
        ))
    elif loss == "rl" and given("teacher"):
        problems.append(SpecProblem(
            "teacher", "conflicting_keys",
            'a [teacher] is only used with loss = "sft"; remove [teacher] or set loss = "sft"',
        ))
    elif loss == "sft" and data.get("teacher") is None and "teacher" not in bad_params:
        problems.append(SpecProblem(
            "teacher", "required", 'loss = "sft" needs a [teacher] with the model to distil from',
        ))

    if given("max_inflight_rollouts") and given("oversampling_factor"):
        problems.append(SpecProblem(
            "oversampling_factor", "conflicting_keys",
            "max_inflight_rollouts and oversampling_factor both bound the rollouts in flight; give one",
        ))
    inflight = plain_int("max_inflight_rollouts")
    largest = max([size for size in sizes.values() if size] or [group_size or 0])
    if inflight and largest and inflight < largest:
        problems.append(SpecProblem(
            "max_inflight_rollouts", "out_of_range",
            f"max_inflight_rollouts ({inflight}) must be at least "
            + (f"rollouts_per_example ({largest})" if largest == group_size else f"the largest [[env]] group_size ({largest})")
            + ": a group is sampled at once",
        ))

    sampling = data.get("sampling")
    schedule = sampling.get("temp_scheduler") if isinstance(sampling, Mapping) else None
    max_steps = plain_int("max_steps")
    if isinstance(schedule, Mapping) and "sampling.temp_scheduler.total_steps" not in bad_params:
        total_steps = schedule.get("total_steps")
        if type(total_steps) is int and max_steps and total_steps > max_steps:
            problems.append(SpecProblem(
                "sampling.temp_scheduler.total_steps", "out_of_range",
                f"total_steps ({total_steps}) must not exceed max_steps ({max_steps})",
            ))

    resources = data.get("resources")
    if isinstance(resources, Mapping):
        problems.extend(_gpu_split_problems(resources, bad_params))
        for key in ("num_train_gpus", "num_infer_gpus"):
            if key in data and key in resources:  # the top-level one is moved in only when alone
                problems.append(SpecProblem(
                    key, "conflicting_keys", f"{key} is given twice, at the top level and in [resources]; give it once",
                ))
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


def _gpu_split_problems(resources: Mapping[str, Any], bad_params: set[str]) -> list[SpecProblem]:
    """Check ``resources.num_train_gpus`` / ``num_infer_gpus`` against ``gpus`` and
    ``gpu_type`` (raw data; keys already refused are skipped): they split a GPU job of 2 GPUs
    or more, and add up to its ``gpus``."""
    split = {}
    for key in ("num_train_gpus", "num_infer_gpus"):
        value = resources.get(key)
        if f"resources.{key}" not in bad_params and type(value) is int:
            split[key] = value
    if not split or "resources.gpus" in bad_params or "resources.gpu_type" in bad_params:
        return []
    first = f"resources.{next(iter(split))}"
    gpu_type = resources.get("gpu_type", ResourcesConfig.model_fields["gpu_type"].default)
    if gpu_type == "cpu":
        return [SpecProblem(first, "invalid_value", 'a CPU job has no GPUs to split: num_train_gpus and '
                            'num_infer_gpus apply when gpu_type names a GPU')]
    gpus = resources.get("gpus")
    if type(gpus) is not int:
        if len(split) == 2:
            return []  # gpus defaults to their sum
        return [SpecProblem(first, "invalid_value", f"{first.split('.')[1]} splits gpus: give gpus too "
                            "(or both num_train_gpus and num_infer_gpus)")]
    if gpus < 2:
        return [SpecProblem(first, "invalid_value", f"gpus = {gpus}: num_train_gpus and num_infer_gpus split "
                            "2 GPUs or more (a 1-GPU job runs its whole engine on its GPU)")]
    given = " + ".join(f"{key} ({value})" for key, value in split.items())
    if len(split) == 2 and sum(split.values()) != gpus:
        return [SpecProblem(first, "invalid_value", f"{given} must add up to gpus ({gpus})")]
    if len(split) == 1 and sum(split.values()) >= gpus:
        return [SpecProblem(first, "invalid_value", f"{given} must leave the other role at least 1 of gpus ({gpus})")]
    return []


def job_spec_json_schema() -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of a job spec, as served at
    ``/api/v1/schema/job-spec.json``. Cross-field and catalogue rules are not expressible
    in it; the API enforces them."""
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Lab job spec"
    return schema
