"""Bodies of the ingest API (docs/ingest-api.md), validated strictly with pydantic.

Sizes: at most 1,000 points, samples or lines per batch (more is 413), metric names up to 128
characters and 512 per point, finite numbers only (rewards and advantages of magnitude at most
``MAX_REWARD``), log lines up to 16 KiB. Numbers are JSON
numbers: a metric value, reward or advantage sent as a string (``"0.5"``) or a boolean is a 400.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, Strict, StringConstraints

MAX_BATCH = 1000

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


def _finite_values(values: dict[str, float]) -> dict[str, float]:
    """Refuse NaN and infinite values, naming the metric."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r} is not a finite number")
    return values


def _storable(text: str) -> str:
    """Refuse text PostgreSQL cannot store: NUL characters and unpaired surrogates."""
    if "\x00" in text:
        raise ValueError("NUL characters cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("unpaired surrogates cannot be stored") from None
    return text


def _printable(text: object) -> object:
    """Make captured output storable before it is validated: NUL becomes U+FFFD and an unpaired
    surrogate "?". Other types pass through to fail the string check."""
    if not isinstance(text, str):
        return text
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


MetricName = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_storable)]
# Values are strict numbers: an integer is taken as a float, "0.5" or true is a 400, not 0.5 or 1.0.
Number = Annotated[float, Strict()]
#: The largest magnitude of a reward, an advantage or a reward function's value: sums, means and
#: histograms over millions of them stay finite (PostgreSQL's double precision raises on overflow,
#: and a bin's width over [-1e308, 1e308] is infinite).
MAX_REWARD = 1e12
Reward = Annotated[float, Strict(), Field(ge=-MAX_REWARD, le=MAX_REWARD)]
# Counts are strict integers: "3", 3.0 or true for a step or an attempt is a 400, not a step 3 or 1.
Step = Annotated[int, Strict(), Field(ge=0, le=1_000_000_000)]
Attempt = Annotated[int, Strict(), Field(ge=1, le=10_000)]
SizeBytes = Annotated[int, Strict(), Field(ge=0, le=2**50)]


class StatusReport(BaseModel):
    """A heartbeat: the attempt's phase and step."""

    model_config = _STRICT
    attempt: Attempt
    phase: Literal["loading", "running", "checkpointing", "finishing"]
    step: Step = 0
    message: Annotated[str, StringConstraints(max_length=2000), BeforeValidator(_printable)] = ""


class MetricPoint(BaseModel):
    """All values of one step."""

    model_config = _STRICT
    step: Step
    time: datetime
    values: Annotated[dict[MetricName, Number], Field(max_length=512), AfterValidator(_finite_values)]


class MetricsBatch(BaseModel):
    """Up to 1,000 metric points of one attempt."""

    model_config = _STRICT
    attempt: Attempt
    points: list[MetricPoint]


class Sample(BaseModel):
    """One rollout sample."""

    model_config = _STRICT
    step: Step
    group: Annotated[int, Strict(), Field(ge=0, le=1_000_000)]
    prompt: Annotated[str, StringConstraints(max_length=65_536), BeforeValidator(_printable)]
    completion: Annotated[str, StringConstraints(max_length=65_536), BeforeValidator(_printable)]
    reward: Reward
    advantage: Reward
    metrics: Annotated[dict[MetricName, Number], Field(max_length=64), AfterValidator(_finite_values)] = {}


class SamplesBatch(BaseModel):
    """Up to 1,000 samples of one attempt; a batch carries all samples of the steps it names."""

    model_config = _STRICT
    attempt: Attempt
    samples: list[Sample]


def storable_json(value: object) -> object:
    """Return ``value``; raise ValueError (a pydantic ``AfterValidator``'s refusal) for a JSON
    value holding text PostgreSQL cannot store (``_storable``: NUL, unpaired surrogates) as a key
    or a string, or over 256 KiB."""
    if len(json.dumps(value)) > 262_144:
        raise ValueError("at most 256 KiB of JSON")

    def walk(item: object) -> None:
        if isinstance(item, str):
            _storable(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                walk(key)
                walk(inner)
        elif isinstance(item, list):
            for inner in item:
                walk(inner)

    walk(value)
    return value


class EvaluationSampleIn(BaseModel):
    """One scored rollout of an evaluation (``jobs.evaluation_samples.EvaluationSample`` says
    what each field holds); (environment, example, rollout) is its key."""

    model_config = _STRICT
    environment: Annotated[int, Strict(), Field(ge=0, le=255)]
    example: Annotated[int, Strict(), Field(ge=0, le=1_000_000)]
    rollout: Annotated[int, Strict(), Field(ge=0, le=10_000)]
    num_examples: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    prompt: Annotated[list[dict[str, JsonValue]], Field(max_length=1_000), AfterValidator(storable_json)]
    completion: Annotated[str, StringConstraints(max_length=262_144), BeforeValidator(_printable)]
    answer: Annotated[str, StringConstraints(max_length=65_536), BeforeValidator(_printable)] = ""
    info: Annotated[dict[str, JsonValue], AfterValidator(storable_json)] = {}
    reward: Reward
    functions: Annotated[dict[MetricName, Reward], Field(max_length=64)] = {}
    prompt_tokens: Annotated[int, Strict(), Field(ge=0, le=10_000_000)] = 0
    completion_tokens: Annotated[int, Strict(), Field(ge=0, le=10_000_000)] = 0
    latency_s: Annotated[float, Strict(), Field(ge=0.0, le=1e7)] = 0.0
    truncated: Annotated[bool, Strict()] = False
    timed_out: Annotated[bool, Strict()] = False
    error: Annotated[str, StringConstraints(max_length=4000), BeforeValidator(_printable)] = ""


class EvaluationSamplesBatch(BaseModel):
    """Up to 1,000 evaluation samples of one attempt."""

    model_config = _STRICT
    attempt: Attempt
    samples: list[EvaluationSampleIn]


class LogLineIn(BaseModel):
    """One log line as the engine numbered it."""

    model_config = _STRICT
    seq: Annotated[int, Strict(), Field(ge=0, le=2**62)]
    time: datetime
    stream: Annotated[str, StringConstraints(min_length=1, max_length=16), AfterValidator(_storable)] = "stdout"
    line: Annotated[str, StringConstraints(max_length=16_384), BeforeValidator(_printable)]


class LogsBatch(BaseModel):
    """Up to 1,000 log lines of one attempt."""

    model_config = _STRICT
    attempt: Attempt
    lines: list[LogLineIn]


class ArtifactRegister(BaseModel):
    """The engine is about to upload a checkpoint, or the adapter artifact (``[adapters]``), of ``step``."""

    model_config = _STRICT
    attempt: Attempt
    step: Step
    format: Literal["peft-lora", "hf-full"]


class ArtifactComplete(BaseModel):
    """The engine finished uploading a checkpoint or an adapter; Lab re-hashes what is stored and
    compares. An adapter's ``size_bytes`` over ``jobs.artifacts.kinds.MAX_ADAPTER_BYTES`` is
    refused with 413 by the lifecycle."""

    model_config = _STRICT
    size_bytes: SizeBytes
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class FinishError(BaseModel):
    """Why an attempt failed, in docs/api.md "Statuses"' ``error.code`` terms."""

    model_config = _STRICT
    code: Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(_storable)]
    message: Annotated[str, StringConstraints(max_length=4000), BeforeValidator(_printable)] = ""


class FinishReport(BaseModel):
    """The attempt is about to exit with this outcome."""

    model_config = _STRICT
    attempt: Attempt
    outcome: Literal["succeeded", "failed", "stopped"]
    error: FinishError | None = None
