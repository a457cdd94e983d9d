"""A job spec to start from, and a readable table of every spec key, both read off the spec's
JSON Schema (:func:`labsdk.spec.job_spec_json_schema`, the one served at
``/api/v1/schema/job-spec.json``), so they follow the spec model as it changes.

``lab spec init`` writes :func:`spec_template`; ``lab spec schema --fields`` prints
:func:`spec_fields`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from labsdk.spec import job_spec_json_schema

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


def _placeholder(node: Mapping[str, Any]) -> str:
    """Return an example value for a commented-out key: its schema's literal id prefix
    (``"ckpt_..."``), else a value of its type."""
    options = [option for option in node.get("anyOf", [node]) if option.get("type") != "null"] or [node]
    option = options[0]
    prefix = re.match(r"^\^([A-Za-z]+_)", option.get("pattern", ""))
    if prefix:
        return json.dumps(prefix.group(1) + "...")
    return {"integer": "0", "number": "0.0", "boolean": "false", "string": '"..."'}.get(option.get("type"), '"..."')


def _comment(text: str) -> str:
    return f"  # {text}" if text else ""


def _key_lines(schema: Mapping[str, Any], node: Mapping[str, Any], given: Mapping[str, Any]) -> Iterator[str]:
    """Yield one line per scalar key of ``node``: given or defaulted keys set, the rest commented."""
    for name, child in node.get("properties", {}).items():
        if "$ref" in child or child.get("type") in ("array", "object") or not _is_lab_setting(child):
            continue
        meaning = child.get("description", "")
        if name in given:
            yield f"{name} = {_toml_value(given[name])}{_comment(meaning)}"
        elif child.get("default") is not None:
            yield f"{name} = {_toml_value(child['default'])}{_comment(meaning)}"
        else:
            yield f"# {name} = {_placeholder(child)}{_comment(meaning)}"


def spec_template(
    *, model: str = DEFAULT_MODEL, env: str = DEFAULT_ENV, env_args: Mapping[str, Any] | None = None,
    name: str | None = None, schema: Mapping[str, Any] | None = None,
) -> str:
    """Return a commented TOML job spec that passes ``lab spec check`` as written.

    ``model`` is a model catalogue id (``lab models``), ``env`` an environment id (``lab envs``)
    with ``env_args`` its arguments (default none: the environment's own defaults); ``name``
    the job's display name (default derived from the environment). Every key Lab uses is
    written with its default and its description as a comment; keys without a default are
    written commented out. ``schema`` defaults to :func:`labsdk.spec.job_spec_json_schema`.
    """
    schema = schema or job_spec_json_schema()
    top = {"model": model, "name": name or f"{env.split('/')[-1].split('@')[0]}-run"}
    lines = [
        "# A Lab job spec (TOML). Every key and its meaning: `lab spec schema --fields` or docs/spec.md.",
        "# Model ids: `lab models`; environment ids and their arguments: `lab envs`.",
        "# Check it with `lab spec check FILE`, then run it with `lab jobs create -f FILE --wait`.",
        "",
        *_key_lines(schema, schema, top),
    ]
    for section, child in schema.get("properties", {}).items():
        resolved = _resolve(schema, child)
        if "$ref" in child:
            lines += ["", f"[{section}]{_comment(resolved.get('description', ''))}", *_key_lines(schema, resolved, {})]
        elif child.get("type") == "array" and "$ref" in child.get("items", {}):
            lines += ["", f"[[{section}]]{_comment(child.get('description', ''))}"]
            item = _resolve(schema, child["items"])
            for name_, field in item.get("properties", {}).items():
                value = {"id": env, "args": dict(env_args or {})}.get(name_)
                if value is not None:
                    lines.append(f"{name_} = {_toml_value(value)}{_comment(field.get('description', ''))}")
        elif child.get("type") == "object" and _is_lab_setting(child):
            lines += ["", f"# [{section}]{_comment(child.get('description', ''))}", '# team = "research"']
    return "\n".join(lines) + "\n"


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
