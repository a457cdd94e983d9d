"""A job spec to start from, and a readable table of every spec key, both read off the spec's
JSON Schema (:func:`labsdk.spec.job_spec_json_schema`, the one served at
``/api/v1/schema/job-spec.json``), so they follow the spec model as it changes.

``lab spec init`` writes :func:`spec_template`; ``lab spec schema --fields`` prints
:func:`spec_fields`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labsdk.spec import job_spec_json_schema
from labsdk.spec.model import PRIME_UNUSED_KEYS

#: The model and environment ``lab spec init`` writes when none is given: the main job's
#: (``examples/addition-smollm2.toml``), both in every Lab's built-in catalogues.
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_ENV = "lab/addition"


@dataclass(frozen=True)
class SpecField:
    """One key of a job spec: ``key`` is its dotted path in TOML terms (``sampling.max_tokens``,
    ``env[].id`` for a key of each ``[[env]]`` table), ``type`` a JSON Schema type in words,
    ``default`` the value used when the key is absent (``None``: no default; ``required`` says
    whether it must be given), ``meaning`` the schema's description."""

    key: str
    type: str
    default: Any
    required: bool
    meaning: str


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if ref and ref.startswith("#/$defs/"):
        return schema["$defs"][ref.removeprefix("#/$defs/")]
    return node


def _type_words(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        return " | ".join(json.dumps(value) for value in node["enum"])
    if "anyOf" in node:
        kinds = [_type_words(option) for option in node["anyOf"] if option.get("type") != "null"]
        return " | ".join(kinds) if kinds else "any"
    kind = node.get("type")
    if kind == "array":
        items = node.get("items", {})
        return "list of tables" if "$ref" in items else f"list of {_type_words(items)}"
    if kind == "object":
        return "table"
    return kind or "any"


def _is_lab_setting(node: Mapping[str, Any]) -> bool:
    """Whether Lab uses the key: keys kept only for Prime Intellect's configs have no type."""
    return any(name in node for name in ("type", "anyOf", "$ref", "enum"))


def spec_fields(schema: Mapping[str, Any] | None = None) -> list[SpecField]:
    """Return every key of the job spec, in the schema's order, sections' keys after the section.

    ``schema`` defaults to :func:`labsdk.spec.job_spec_json_schema`. Keys accepted only so that
    Prime Intellect's configs run unchanged (stored, listed in the job's warnings) are included,
    with their description saying so.
    """
    schema = schema or job_spec_json_schema()
    fields: list[SpecField] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        required = set(node.get("required", ()))
        for name, child in node.get("properties", {}).items():
            key = f"{prefix}{name}"
            resolved = _resolve(schema, child)
            items = child.get("items", {})
            meaning = child.get("description") or resolved.get("description") or ""
            if "$ref" in child:  # a section such as [sampling]
                fields.append(SpecField(key, "table", None, name in required, meaning))
                walk(resolved, f"{key}.")
            elif child.get("type") == "array" and "$ref" in items:  # [[env]]
                fields.append(SpecField(key, "list of tables", None, name in required, meaning))
                walk(_resolve(schema, items), f"{key}[].")
            else:
                fields.append(SpecField(key, _type_words(child), child.get("default"), name in required, meaning))

    walk(schema, "")
    return fields


def _toml_value(value: Any) -> str:
    """Return ``value`` as a TOML value (strings as JSON strings, which TOML reads the same)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


#: Keys ``lab spec init`` leaves out: other names for keys it writes (Prime's and deprecated
#: spellings), keys Lab only stores for Prime Intellect's configs, and what Lab records or writes
#: itself (an evaluation job's ``eval.adapter`` and ``eval.endpoint``). ``lab spec schema
#: --fields`` lists them all.
_NOT_IN_TEMPLATE = frozenset(
    {"checkpoint_id", "max_async_level", "env_file", "translated_from", "eval.eval_base_model",
     "checkpoints.keep_cloud", "eval.adapter", "eval.endpoint"}
    | (set(PRIME_UNUSED_KEYS) - {"env_files"})
)

#: Example values of the commented-out keys (TOML), by dotted key, each one a valid spec once
#: uncommented in the template as written; with a second item, the settings of the same table
#: it needs besides (written in its comment as "Uncomment with ..."). ``{env}`` is the
#: template's environment id. Keys not here get a value of their type within its bounds.
_EXAMPLES: dict[str, str | tuple[str, str]] = {
    "teacher": ('{ model = "Qwen/Qwen3-4B-Instruct-2507" }', 'loss = "sft"'),
    "max_inflight_rollouts": "64",
    "oversampling_factor": "2.0",
    "val": "{ num_examples = 32, interval = 10 }",
    "pre_batch_filters": '[{ type = "zero_advantage" }]',
    "post_batch_filters": '[{ type = "repetition", ngram_size = 4, max_repeats = 8 }]',
    "adapters": "{ interval = 10, keep_last = 3 }",
    "metadata": '{ team = "research" }',
    "env_files": '["secrets.env"]',
    "sampling.temp_scheduler": '{ type = "cosine", start_temperature = 1.0, end_temperature = 0.5 }',
    "sampling.extra_body": "{ top_p = 0.95 }",
    "eval.sampling": "{ temperature = 0.0 }",
    "eval.env": '[{ id = "{env}", num_examples = 16 }]',
    "resources.gpus": ("1", 'gpu_type = "H100"'),
    "resources.num_train_gpus": ("1", 'gpu_type = "H100", gpus = 2'),
    "resources.num_infer_gpus": ("1", 'gpu_type = "H100", gpus = 2'),
}

#: How a placeholder's comment names the settings it needs besides: ``Uncomment with a = 1, b = "x".``
UNCOMMENT_WITH = "Uncomment with "


def _placeholder(node: Mapping[str, Any]) -> str:
    """Return a valid example value for a commented-out key of this schema ``node`` without an
    entry in :data:`_EXAMPLES`: an id matching its pattern (``"ckpt_0123456789abcdefghij"``),
    the first of its choices, else a value of its type within its bounds."""
    options = [option for option in node.get("anyOf", [node]) if option.get("type") != "null"] or [node]
    option = options[0]
    prefix = re.match(r"^\^([A-Za-z]+_)", option.get("pattern", ""))
    if prefix:
        return json.dumps(prefix.group(1) + "0123456789abcdefghij")
    if "enum" in option:
        return _toml_value(option["enum"][0])
    kind = option.get("type")
    if kind in ("integer", "number"):
        value = max(1, option.get("minimum", 1), option.get("exclusiveMinimum", 0) + 1)
        value = min(value, option.get("maximum", value))
        return repr(int(value) if kind == "integer" else float(value))
    return {"boolean": "false", "object": "{}", "array": "[]"}.get(kind, '"example"')


def _comment(text: str) -> str:
    return f"  # {text}" if text else ""


def _key_lines(
    schema: Mapping[str, Any], node: Mapping[str, Any], given: Mapping[str, Any], *, path: str = "", env: str = "",
) -> Iterator[str]:
    """Yield one line per key of ``node`` (``path``: its dotted prefix) but sections and lists of
    tables written apart: given or defaulted keys set, the rest commented out with an example."""
    for name, child in node.get("properties", {}).items():
        key = f"{path}{name}"
        if "$ref" in child or not _is_lab_setting(child) or key in _NOT_IN_TEMPLATE:
            continue
        if child.get("type") == "array" and "$ref" in child.get("items", {}):
            continue  # [[env]]
        meaning = child.get("description", "")
        if name in given:
            yield f"{name} = {_toml_value(given[name])}{_comment(meaning)}"
        elif child.get("default") is not None and child.get("type") not in ("object", "array"):
            yield f"{name} = {_toml_value(child['default'])}{_comment(meaning)}"
        else:
            example = _EXAMPLES.get(key) or _placeholder(child)
            value, needs = example if isinstance(example, tuple) else (example, "")
            if needs:
                meaning = f"{meaning} {UNCOMMENT_WITH}{needs}.".strip()
            yield f"# {name} = {value.replace('{env}', env)}{_comment(meaning)}"


#: Turns of a multi-turn episode ``lab spec init`` writes when the environment has no
#: ``max_turns`` argument of its own (``lab envs try --max-turns``'s default too).
DEFAULT_MAX_TURNS = 8


def episode_budget(
    *, context_length: int | None, max_turns: int, default_max_tokens: int, multi_turn: bool,
) -> int:
    """Return ``sampling.max_tokens`` that fits a model of ``context_length`` tokens (None:
    unknown, ``default_max_tokens``): half the context for a single-turn reply (the prompt has
    the rest); for a multi-turn episode, whose ``max_turns`` replies, prompt and environment
    turns share one sequence, the context over ``2 × max_turns`` (a reply and an environment turn
    each), never more than ``default_max_tokens``."""
    if not context_length:
        return default_max_tokens
    share = context_length // (2 * max_turns) if multi_turn else context_length // 2
    return max(1, min(default_max_tokens, share))


def _episode_lines(
    item: Mapping[str, Any], *, max_turns: int, max_tokens: int, context_length: int | None,
) -> list[str]:
    """The ``[[env]]`` lines of a multi-turn environment: ``max_turns`` set, and the token caps and
    timeout commented out with values that fit (``max_output_tokens`` the episode's replies at
    ``max_tokens`` each, ``max_input_tokens`` the model's context)."""
    fields = item.get("properties", {})

    def meaning(key: str, more: str = "") -> str:
        return _comment(f"{fields.get(key, {}).get('description', '')}{more}".strip())

    return [
        f"max_turns = {max_turns}{meaning('max_turns', ' A multi-turn environment: its episodes stop there.')}",
        f"# max_output_tokens = {max_turns * max_tokens}{meaning('max_output_tokens', ' Optional.')}",
        f"# max_input_tokens = {context_length or 4096}{meaning('max_input_tokens', ' Optional.')}",
        f"# timeout = 600.0{meaning('timeout', ' Optional.')}",
    ]


def spec_template(
    *, model: str = DEFAULT_MODEL, env: str = DEFAULT_ENV, env_args: Mapping[str, Any] | None = None,
    name: str | None = None, schema: Mapping[str, Any] | None = None, models: Sequence[str] = (),
    multi_turn: bool = False, context_length: int | None = None, judge: Mapping[str, str | None] | None = None,
) -> str:
    """Return a commented TOML job spec that passes ``lab spec check`` as written.

    ``model`` is a model catalogue id (``lab models``), ``env`` an environment id (``lab envs``)
    with ``env_args`` its arguments (default none: the environment's own defaults); ``name``
    the job's display name (default derived from the environment). Every key Lab uses is
    written with its default and its description as a comment; keys without a default are
    written commented out with an example value, and each one, uncommented alone (with the
    settings its comment names after "Uncomment with"), still passes. ``schema`` defaults to
    :func:`labsdk.spec.job_spec_json_schema`. ``models`` lists the models the organization may
    use, one comment line each (``lab models`` describes them; ``lab spec init`` passes them
    when it can ask Lab). ``multi_turn``: the environment plays multi-turn episodes, so its
    ``[[env]]`` gets ``max_turns`` (``env_args``' own ``max_turns`` when it has one, else
    ``DEFAULT_MAX_TURNS``) and, commented out, the token caps and timeout that bound an episode.
    ``context_length``: the model's context in tokens, which ``sampling.max_tokens`` is fitted to
    (``episode_budget``). ``judge``: the environment takes Prime's judge arguments, so its
    ``[[env]]`` gets ``judge`` commented out (``judge_line``) with these defaults
    (``{"base_url", "model", "api_key_var"}``, None where it has none).
    """
    schema = schema or job_spec_json_schema()
    own_turns = (env_args or {}).get("max_turns")
    max_turns = own_turns if isinstance(own_turns, int) and not isinstance(own_turns, bool) and own_turns > 0 else DEFAULT_MAX_TURNS
    sampling = _resolve(schema, schema.get("properties", {}).get("sampling", {}))
    default_max_tokens = sampling.get("properties", {}).get("max_tokens", {}).get("default", 128)
    max_tokens = episode_budget(
        context_length=context_length, max_turns=max_turns, default_max_tokens=default_max_tokens, multi_turn=multi_turn,
    )
    sections = {"sampling": {"max_tokens": max_tokens}} if max_tokens != default_max_tokens else {}
    top = {"model": model, "name": name or f"{env.split('/')[-1].split('@')[0]}-run"}
    lines = [
        "# A Lab job spec (TOML). Every key and its meaning: `lab spec schema --fields` or docs/spec.md.",
        "# Model ids: `lab models`; environment ids and their arguments: `lab envs`.",
        "# Check it with `lab spec check FILE`, then run it with `lab jobs create -f FILE --wait`.",
        *(["# The models this organization may use (`lab models` describes them):"] if models else []),
        *(f"#   {line}" for line in models),
        "",
        *_key_lines(schema, schema, top, env=env),
    ]
    for section, child in schema.get("properties", {}).items():
        resolved = _resolve(schema, child)
        if "$ref" in child:
            lines += ["", f"[{section}]{_comment(resolved.get('description', ''))}",
                      *_key_lines(schema, resolved, sections.get(section, {}), path=f"{section}.", env=env)]
        elif child.get("type") == "array" and "$ref" in child.get("items", {}):
            lines += ["", f"[[{section}]]{_comment(child.get('description', ''))}"]
            item = _resolve(schema, child["items"])
            for name_, field in item.get("properties", {}).items():
                value = {"id": env, "args": dict(env_args or {})}.get(name_)
                if value is not None:
                    lines.append(f"{name_} = {_toml_value(value)}{_comment(field.get('description', ''))}")
            if judge is not None:
                lines.append(judge_line(judge))
            if multi_turn:
                lines += _episode_lines(item, max_turns=max_turns, max_tokens=max_tokens, context_length=context_length)
    return "\n".join(lines) + "\n"


#: What ``judge_line`` writes for a judge endpoint's key the environment has no default for.
_JUDGE_PLACEHOLDERS = {"base_url": "https://host/v1", "model": None, "api_key_var": "JUDGE_API_KEY"}


def judge_line(defaults: Mapping[str, str | None]) -> str:
    """Return ``[[env]] judge`` commented out, a valid example once uncommented: the endpoint
    ``{base_url, model, api_key_var}`` with the environment's ``defaults`` (``_JUDGE_PLACEHOLDERS``
    where it has none; ``model`` left out then), and what declaring it does."""
    values = {key: defaults.get(key) or placeholder for key, placeholder in _JUDGE_PLACEHOLDERS.items()}
    table = ", ".join(f"{key} = {json.dumps(value)}" for key, value in values.items() if value is not None)
    return (
        f"# judge = {{ {table} }}  # The environment's judge endpoint, which Lab passes as its judge_* args; args "
        "alone do not declare it, and the job's network reaches only a declared one. "
        f"{UNCOMMENT_WITH}its API key as a job secret (-e {values['api_key_var']}=...)."
    )


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, Mapping) for item in value)


def spec_to_toml(spec: Mapping[str, Any], *, comment: str = "") -> str:
    """Return ``spec`` (a spec as JSON data, e.g. a Job's ``spec``) as TOML that reads back to the
    same data, ``None`` values left out: scalars first, then a ``[section]`` per table and a
    ``[[section]]`` per item of a list of tables (their own tables inline). ``comment`` lines go
    on top, each prefixed with ``# ``. Format: TOML 1.0 (toml.io/en/v1.0.0)."""
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]

    def table(data: Mapping[str, Any], path: str) -> None:
        for key, value in data.items():
            if value is not None and not isinstance(value, Mapping) and not _is_table_list(value):
                lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        for key, value in data.items():
            if isinstance(value, Mapping):
                lines.extend(["", f"[{path}{_toml_key(key)}]"])
                table(value, f"{path}{_toml_key(key)}.")
        for key, value in data.items():
            if _is_table_list(value):
                for item in value:
                    lines.extend(["", f"[[{path}{_toml_key(key)}]]"])
                    lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in item.items() if v is not None)

    table(spec, "")
    return "\n".join(lines).lstrip("\n") + "\n"
