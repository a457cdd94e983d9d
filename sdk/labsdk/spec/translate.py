"""Pydantic's validation errors in the spec's terms: one :class:`SpecProblem` per error,
with the dotted ``param``, a code of the spec vocabulary and a message for people."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from labsdk.spec.model import (
    AdaptersConfig,
    CheckpointsConfig,
    EnvConfig,
    EvalConfig,
    EvalEnvConfig,
    EvalSamplingConfig,
    JobSpec,
    ResourcesConfig,
    SamplingConfig,
    TeacherClientConfig,
    TeacherConfig,
    TeacherSamplingConfig,
    TemperatureScheduleConfig,
    TranslatedFrom,
    ValConfig,
)
from labsdk.spec.problems import VOCABULARY, SpecProblem
from labsdk.spec.values import _json_type, _printable

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
    ("eval", "env", "id"): 'must be an environment id like "lab/addition" or "owner/name@version"',
    ("checkpoint_id",): 'must be a checkpoint id like "ckpt_..."',
    ("teacher", "client", "api_key_var"): "must be an environment variable name (letters, digits, _)",
    ("init_from",): 'must be a checkpoint id like "ckpt_..."',
    ("resources", "gpu_type"): 'must be "cpu" or a GPU type name such as "H100"',
}

_MODEL_AT_PATH: dict[tuple[str, ...], type[BaseModel]] = {
    (): JobSpec,
    ("sampling",): SamplingConfig,
    ("sampling", "temp_scheduler"): TemperatureScheduleConfig,
    ("teacher",): TeacherConfig,
    ("teacher", "client"): TeacherClientConfig,
    ("teacher", "sampling"): TeacherSamplingConfig,
    ("env",): EnvConfig,
    ("eval",): EvalConfig,
    ("eval", "sampling"): EvalSamplingConfig,
    ("eval", "env"): EvalEnvConfig,
    ("val",): ValConfig,
    ("checkpoints",): CheckpointsConfig,
    ("adapters",): AdaptersConfig,
    ("resources",): ResourcesConfig,
    ("translated_from",): TranslatedFrom,
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
    elif kind in VOCABULARY:
        code = kind
    elif kind == "float_type" and type(error.get("input")) is int:
        code = "out_of_range"  # an integer too large to be a float (bool is a type error)
    else:
        code = "invalid_type"

    if code == "unknown_key":
        parent = tuple(part for part in loc[:-1] if not part.isdigit())
        model = _MODEL_AT_PATH.get(parent)
        allowed = list(model.model_fields) if model else []
        close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6)
        message = f"unknown key '{loc[-1]}'" + (f" (did you mean '{close[0]}'?)" if close else "")
        message += f"; allowed keys: {', '.join(allowed)}" if allowed else ""
    elif code == "required" and kind == "missing":
        message = f"'{loc[-1]}' is required"
    elif code == "invalid_type" and kind not in VOCABULARY:
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
