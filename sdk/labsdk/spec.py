"""The job spec: one pydantic model shared by the server, the SDK/CLI and the RL engine.

A job spec says which base model to train, on which environments, with which GRPO
settings. It travels as JSON over the API and as TOML in files (DESIGN.md §4 "Job spec").
The format is a superset of Prime Intellect's hosted-training TOML
(https://docs.primeintellect.ai/hosted-training/advanced-configs): Prime's keys that Lab
does not use are accepted, kept in the canonical dict and reported as warnings; any other
unknown key is refused with the list of allowed keys.

Validation reports every problem at once as :class:`SpecProblem` rows with a dotted
``param`` path (list indexes as numbers, e.g. ``env.0.id``) and one ``code`` of this
vocabulary:

==========================  ==========================================================
code                        meaning
==========================  ==========================================================
``required``                a required key is missing
``invalid_type``            wrong JSON type (string for a number, float for an integer)
``invalid_value``           right type, refused value (NaN/inf, bad pattern, bad choice,
                            NUL or an unpaired surrogate in text)
``out_of_range``            a number outside its bounds
``too_long``                a string, list or mapping over its size limit
``too_short``               an empty string or list where one item is needed
``too_deep``                JSON-like data nested deeper than allowed
``unknown_key``             a key the spec does not define
``not_divisible``           ``batch_size`` is not a multiple of ``rollouts_per_example``
``unknown_model``           the model id is not in the model catalogue
``unknown_environment``     an environment id is not installed
``invalid_encoding``        a spec file that is not UTF-8
``invalid_syntax``          a spec file that is not valid TOML or JSON
``duplicate_key``           a key given twice in a spec file
``too_large``               a spec file over 1 MiB (the API's body limit)
==========================  ==========================================================

Only ``model`` and ``env`` are required. Defaults: ``max_steps`` 20, ``batch_size`` 32,
``rollouts_per_example`` 4, ``learning_rate`` 1e-4 and ``lora_alpha`` 16 (Prime's documented
defaults), ``lora_rank`` 16 (0 = full fine-tune), ``seed`` 0, ``max_restarts`` 2,
``max_off_policy_steps`` 1, ``priority`` normal, ``max_runtime_minutes`` 600,
``sampling.max_tokens`` 128, ``sampling.temperature`` 1.0, ``eval.interval`` 0 (no eval),
``eval.num_examples`` 32, ``checkpoints.interval`` 10 (0 = only the last step),
``checkpoints.keep_last`` 3, ``resources.gpu_type`` cpu, ``resources.gpus`` 0 on cpu and 1
on a GPU type. Every number has bounds; see each field.

Nothing here imports Django or torch; the catalogues are passed in by the caller.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "PRIME_UNUSED_KEYS",
    "CheckpointsConfig",
    "EnvConfig",
    "EvalConfig",
    "JobSpec",
    "ParsedSpec",
    "ResourcesConfig",
    "SamplingConfig",
    "SpecError",
    "SpecProblem",
    "catalog_problems",
    "decode_spec",
    "job_spec_json_schema",
    "load_spec_file",
    "loads_spec",
    "parse_spec",
    "read_spec_file",
]

#: Largest spec file or body accepted, in bytes (the REST API refuses bodies over 1 MB).
MAX_SPEC_BYTES = 1024 * 1024

#: Limits on JSON-like values (environment ``args`` and Prime's stored keys).
JSON_MAX_DEPTH = 8
JSON_MAX_ITEMS = 1000
JSON_MAX_STRING = 10_000
JSON_MAX_KEY = 128
JSON_MAX_INT = 2**63 - 1

#: Prime Intellect keys Lab accepts and stores but does not act on, as dotted paths.
#: Prime's docs spell the secrets key ``env_file``; DESIGN.md says ``env_files``: both are kept.
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


@dataclass(frozen=True)
class SpecProblem:
    """One problem found in a spec.

    ``param`` is the dotted path of the bad field with list indexes as numbers
    (``env.0.id``; ``""`` for the file as a whole), ``code`` one of the module's codes,
    ``message`` a sentence for people.
    """

    param: str
    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """Return the problem as the API's ``{"param", "code", "message"}`` object."""
        return {"param": self.param, "code": self.code, "message": self.message}


class SpecError(Exception):
    """A spec was refused; ``errors`` lists every problem found: field problems in the
    spec's field order, then cross-field rules."""

    def __init__(self, errors: list[SpecProblem]):
        self.errors = errors
        super().__init__("; ".join(f"{e.param or '<spec>'}: {e.message}" for e in errors))

    @property
    def param(self) -> str:
        """The dotted path of the first problem (the API error's ``param``)."""
        return self.errors[0].param if self.errors else ""


def _text_problem(text: str) -> str | None:
    """Say why ``text`` cannot be stored, or ``None``: databases refuse NUL (PostgreSQL's
    text and jsonb cannot hold U+0000) and UTF-8 cannot encode an unpaired surrogate (a JSON
    ``\\ud800`` escape decodes to one)."""
    if "\x00" in text:
        return "must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (it holds an unpaired surrogate)"
    return None


def _check_text(value: str) -> str:
    """Refuse strings that cannot be stored (see :func:`_text_problem`)."""
    problem = _text_problem(value)
    if problem:
        raise PydanticCustomError("invalid_value", problem)
    return value


def _printable(text: str) -> str:
    """Return ``text`` with NUL and unpaired surrogates escaped, fit for a message or path."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _check_json_like(value: Any) -> Any:
    """Refuse values that are not small, finite JSON: depth, item count, string size.

    Raises ``PydanticCustomError`` whose context carries ``subpath``, the dotted path of
    the offending part inside the value, so problems point at ``env.0.args.x.2``.
    """
    items = 0

    def walk(node: Any, path: list[str], depth: int) -> None:
        nonlocal items
        subpath = ".".join(path)
        if depth > JSON_MAX_DEPTH:
            raise PydanticCustomError(
                "too_deep", "nested deeper than {max_depth} levels",
                {"max_depth": JSON_MAX_DEPTH, "subpath": subpath},
            )
        items += 1
        if items > JSON_MAX_ITEMS:
            raise PydanticCustomError(
                "too_long", "more than {max_items} values in all",
                {"max_items": JSON_MAX_ITEMS, "subpath": ""},
            )
        if node is None or isinstance(node, bool):
            return
        if isinstance(node, int):
            if abs(node) > JSON_MAX_INT:
                raise PydanticCustomError(
                    "out_of_range", "integer outside the 64-bit range", {"subpath": subpath}
                )
            return
        if isinstance(node, float):
            if not math.isfinite(node):
                raise PydanticCustomError(
                    "invalid_value", "NaN and infinity are not allowed", {"subpath": subpath}
                )
            return
        if isinstance(node, str):
            problem = _text_problem(node)
            if problem:
                raise PydanticCustomError("invalid_value", problem, {"subpath": subpath})
            if len(node) > JSON_MAX_STRING:
                raise PydanticCustomError(
                    "too_long", "string longer than {max_length} characters",
                    {"max_length": JSON_MAX_STRING, "subpath": subpath},
                )
            return
        if isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, [*path, str(index)], depth + 1)
            return
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise PydanticCustomError(
                        "invalid_type", "keys must be strings", {"subpath": subpath}
                    )
                problem = _text_problem(key)
                if problem:
                    raise PydanticCustomError(
                        "invalid_value", "key " + problem, {"subpath": _printable(".".join([*path, key]))}
                    )
                if len(key) > JSON_MAX_KEY:
                    raise PydanticCustomError(
                        "too_long", "key longer than {max_length} characters",
                        {"max_length": JSON_MAX_KEY, "subpath": subpath},
                    )
                walk(item, [*path, key], depth + 1)
            return
        raise PydanticCustomError(
            "invalid_type",
            "{type_name} is not a JSON value (use strings, numbers, booleans, lists, tables)",
            {"type_name": type(node).__name__, "subpath": subpath},
        )

    walk(value, [], 0)
    return value


#: Any small, finite JSON value (see :data:`JSON_MAX_DEPTH` and friends).
JsonLike = Annotated[Any, AfterValidator(_check_json_like)]
#: A JSON object of such values, e.g. an environment's ``args``.
JsonObject = Annotated[dict[str, Any], AfterValidator(_check_json_like)]

#: A string that can be stored: no NUL, no unpaired surrogate.
Text = Annotated[str, AfterValidator(_check_text)]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(_check_text)]
MetadataValue = Annotated[str, StringConstraints(max_length=512), AfterValidator(_check_text)]

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
    """A training job: base model, environments and GRPO settings (DESIGN.md §4).

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
        gpu_type = resources.get("gpu_type", "cpu")
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


_VOCABULARY = frozenset({
    "required", "invalid_type", "invalid_value", "out_of_range", "too_long", "too_short",
    "too_deep", "unknown_key", "not_divisible", "unknown_model", "unknown_environment",
    "invalid_encoding", "invalid_syntax", "duplicate_key", "too_large",
})


_CODE_BY_PYDANTIC_TYPE = {
    "missing": "required",
    "extra_forbidden": "unknown_key",
    "greater_than": "out_of_range",
    "greater_than_equal": "out_of_range",
    "less_than": "out_of_range",
    "less_than_equal": "out_of_range",
    "string_too_long": "too_long",
    "too_long": "too_long",
    "string_too_short": "too_short",
    "too_short": "too_short",
    "string_pattern_mismatch": "invalid_value",
    "literal_error": "invalid_value",
    "finite_number": "invalid_value",
    "string_unicode": "invalid_value",
}

_PATTERN_MESSAGES = {
    ("env", "id"): 'must be an environment id like "lab/addition" or "owner/name@version"',
    ("init_from",): 'must be a checkpoint id like "ckpt_..."',
    ("resources", "gpu_type"): 'must be "cpu" or a GPU type name such as "H100"',
}

_MODEL_AT_PATH: dict[tuple[str, ...], type[BaseModel]] = {
    (): JobSpec,
    ("sampling",): SamplingConfig,
    ("env",): EnvConfig,
    ("eval",): EvalConfig,
    ("checkpoints",): CheckpointsConfig,
    ("resources",): ResourcesConfig,
}


def _problem_from_pydantic(error: Mapping[str, Any]) -> SpecProblem:
    """Translate one pydantic error dict into a :class:`SpecProblem`."""
    kind = error["type"]
    context = error.get("ctx") or {}
    loc = [_printable(str(part)) for part in error["loc"] if part != "[key]"]
    if "param" in context:
        return SpecProblem(context["param"], kind, error["msg"])
    if context.get("subpath"):
        loc.append(context["subpath"])
    param = ".".join(loc)
    if kind in _CODE_BY_PYDANTIC_TYPE:
        code = _CODE_BY_PYDANTIC_TYPE[kind]
    elif kind in _VOCABULARY:
        code = kind
    elif kind == "float_type" and type(error.get("input")) is int:
        code = "out_of_range"  # an integer too large to be a float (bool is a type error)
    else:
        code = "invalid_type"

    if code == "unknown_key":
        parent = tuple(part for part in loc[:-1] if not part.isdigit())
        model = _MODEL_AT_PATH.get(parent)
        allowed = ", ".join(model.model_fields) if model else ""
        message = f"unknown key '{loc[-1]}'" + (f"; allowed keys: {allowed}" if allowed else "")
    elif code == "required":
        message = f"'{loc[-1]}' is required"
    elif code == "invalid_type" and kind not in _VOCABULARY:
        message = f"{error['msg']} (got {_json_type(error.get('input'))})"
    elif kind == "float_type":
        message = "number too large"
    elif kind == "string_unicode":
        message = "holds text that is not valid Unicode (an unpaired surrogate), as a key or a value"
    elif kind == "string_pattern_mismatch":
        field_path = tuple(part for part in loc if not part.isdigit())
        message = _PATTERN_MESSAGES.get(field_path, error["msg"])
    else:
        message = error["msg"]
    return SpecProblem(param, code, message)


@dataclass(frozen=True)
class ParsedSpec:
    """A valid spec with the warnings found while parsing it."""

    spec: JobSpec
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the canonical JSON-able dict: every Lab key with its default filled in,
        plus the Prime Intellect keys that were given (absent ones are left out)."""
        data = self.spec.model_dump(mode="json")
        for path in PRIME_UNUSED_KEYS:
            *parents, key = path.split(".")
            holder = data
            for part in parents:
                holder = holder[part]
            if holder.get(key) is None:
                holder.pop(key, None)
        return data


def parse_spec(data: Mapping[str, Any]) -> ParsedSpec:
    """Validate a spec given as a mapping (decoded JSON or TOML).

    Returns the :class:`ParsedSpec`; warnings name the Prime Intellect keys that were
    stored but are not used. Raises :class:`SpecError` listing every problem at once:
    field errors, unknown keys and cross-field rules together. Catalogue checks (model,
    environments, context length) are separate: :func:`catalog_problems`.
    """
    if not isinstance(data, Mapping):
        raise SpecError([SpecProblem(
            "", "invalid_type", f"a spec must be a JSON object, not {type(data).__name__}"
        )])
    problems: list[SpecProblem] = []
    try:
        spec = JobSpec.model_validate(dict(data))
    except ValidationError as exc:
        spec = None
        problems = [_problem_from_pydantic(e) for e in exc.errors(include_url=False)]
    if spec is None:
        bad_params = {problem.param for problem in problems}
        for problem in _cross_field_problems(data, bad_params):
            if problem not in problems:
                problems.append(problem)
        raise SpecError(problems)

    warnings = []
    for path in PRIME_UNUSED_KEYS:
        *parents, key = path.split(".")
        holder: Any = data
        for part in parents:
            holder = holder.get(part) if isinstance(holder, Mapping) else None
        if isinstance(holder, Mapping) and key in holder:
            warnings.append(
                f"'{path}' is a Prime Intellect setting that Lab does not use; "
                "it is stored and ignored"
            )
    return ParsedSpec(spec=spec, warnings=warnings)


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def decode_spec(text: str | bytes, format: Literal["toml", "json"]) -> Any:
    """Decode spec text (TOML or JSON) into plain data without validating it.

    ``text`` may be bytes (must be UTF-8) or str; at most :data:`MAX_SPEC_BYTES`.
    Raises :class:`SpecError` (``param`` ``""``) for oversized, undecodable, malformed or
    duplicate-key input; never another exception for bad input.
    """
    if format not in ("toml", "json"):
        raise ValueError(f"format must be 'toml' or 'json', not {format!r}")
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise SpecError([SpecProblem(
            "", "too_large", f"the spec is {size} bytes; the limit is {MAX_SPEC_BYTES}"
        )])
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError([SpecProblem(
                "", "invalid_encoding",
                f"the spec is not UTF-8 text (bad byte at offset {exc.start})",
            )]) from None
    return _decode_toml(text) if format == "toml" else _decode_json(text)


def loads_spec(text: str | bytes, format: Literal["toml", "json"]) -> ParsedSpec:
    """Decode a spec from TOML or JSON text (:func:`decode_spec`) and validate it
    (:func:`parse_spec`). Raises :class:`SpecError` listing the problems."""
    return parse_spec(decode_spec(text, format))


def _decode_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        code = "duplicate_key" if message.startswith(("Cannot overwrite", "Cannot declare")) \
            else "invalid_syntax"
        raise SpecError([SpecProblem("", code, f"invalid TOML: {message}")]) from None
    except RecursionError:
        raise SpecError([SpecProblem(
            "", "too_deep", "invalid TOML: nested too deeply to read"
        )]) from None


def _decode_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as exc:
        raise SpecError([SpecProblem(
            "", "duplicate_key", f"invalid JSON: key '{exc.key}' appears twice in one object"
        )]) from None
    except json.JSONDecodeError as exc:
        raise SpecError([SpecProblem("", "invalid_syntax", f"invalid JSON: {exc}")]) from None
    except RecursionError:
        raise SpecError([SpecProblem(
            "", "too_deep", "invalid JSON: nested too deeply to read"
        )]) from None
    except ValueError:  # an integer with more digits than Python converts (4,300)
        raise SpecError([SpecProblem(
            "", "out_of_range", "invalid JSON: an integer has too many digits"
        )]) from None


def read_spec_file(path: str | Path) -> Any:
    """Read a spec file into plain data without validating it: ``.json`` as JSON,
    anything else as TOML. Raises :class:`SpecError` as :func:`decode_spec` does, and
    ``OSError`` when the file cannot be read."""
    path = Path(path)
    with path.open("rb") as handle:
        raw = handle.read(MAX_SPEC_BYTES + 1)
    return decode_spec(raw, "json" if path.suffix.lower() == ".json" else "toml")


def load_spec_file(path: str | Path) -> ParsedSpec:
    """Read and validate a spec file (:func:`read_spec_file`, then :func:`parse_spec`).

    Raises :class:`SpecError` listing the problems, ``OSError`` when unreadable.
    """
    return parse_spec(read_spec_file(path))


class ModelInfoLike(Protocol):
    """What :func:`catalog_problems` needs of a model catalogue entry."""

    context_length: int


class EnvironmentInfoLike(Protocol):
    """What :func:`catalog_problems` needs of an environment catalogue entry."""

    args: Mapping[str, Any]


def _json_type(value: Any) -> str:
    """Name the JSON type of a decoded value (``integer`` and ``number`` kept apart)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _type_fits(value: Any, default: Any) -> bool:
    expected, given = _json_type(default), _json_type(value)
    return expected == "null" or given == expected or (expected, given) == ("number", "integer")


def catalog_problems(
    spec: JobSpec,
    *,
    models: Mapping[str, ModelInfoLike],
    environments: Mapping[str, EnvironmentInfoLike],
) -> list[SpecProblem]:
    """Check a valid spec against the installed model and environment catalogues.

    ``models`` maps catalogue ids to objects with ``context_length`` (tokens);
    ``environments`` maps environment ids to objects whose ``args`` holds each argument's
    default (its JSON type is the argument's type; a ``None`` default takes anything).
    Returns the problems (empty when the spec fits): ``unknown_model`` at ``model``,
    ``unknown_environment`` at ``env.N.id``, ``unknown_key``/``invalid_type`` at
    ``env.N.args.KEY``, ``out_of_range`` at ``sampling.max_tokens`` beyond the context.
    """
    problems: list[SpecProblem] = []
    model = models.get(spec.model)
    if model is None:
        problems.append(SpecProblem(
            "model", "unknown_model",
            f"model '{spec.model}' is not in the catalogue; installed models: "
            f"{', '.join(sorted(models)) or 'none'}",
        ))
    elif spec.sampling.max_tokens > model.context_length:
        problems.append(SpecProblem(
            "sampling.max_tokens", "out_of_range",
            f"max_tokens {spec.sampling.max_tokens} exceeds the context length of "
            f"'{spec.model}' ({model.context_length} tokens)",
        ))
    for index, env in enumerate(spec.env):
        environment = environments.get(env.id)
        if environment is None:
            problems.append(SpecProblem(
                f"env.{index}.id", "unknown_environment",
                f"environment '{env.id}' is not installed; installed environments: "
                f"{', '.join(sorted(environments)) or 'none'}",
            ))
            continue
        defaults = environment.args
        for key, value in env.args.items():
            if key not in defaults:
                problems.append(SpecProblem(
                    f"env.{index}.args.{key}", "unknown_key",
                    f"'{env.id}' takes no argument '{key}'; allowed: "
                    f"{', '.join(defaults) or 'none'}",
                ))
            elif not _type_fits(value, defaults[key]):
                problems.append(SpecProblem(
                    f"env.{index}.args.{key}", "invalid_type",
                    f"'{key}' must be a JSON {_json_type(defaults[key])}, "
                    f"not {_json_type(value)}",
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
