"""Guards for the values a spec may hold: storable text and small, finite JSON.

Databases refuse some text (NUL, unpaired surrogates) and Lab bounds what a spec carries in
free-form fields (environment ``args``, Prime Intellect's stored keys); the annotated types
here refuse such values with the spec vocabulary's codes and the path of the bad part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, StringConstraints
from pydantic_core import PydanticCustomError

#: Limits on JSON-like values (environment ``args`` and Prime's stored keys).
JSON_MAX_DEPTH = 8
JSON_MAX_ITEMS = 1000
JSON_MAX_STRING = 10_000
JSON_MAX_KEY = 128
JSON_MAX_INT = 2**63 - 1
#: The deepest a whole spec may nest tables and arrays (the spec itself is level 1). The deepest
#: valid spec is ``metadata`` at level 2 holding values 16 levels deep; this leaves room for
#: Prime's free-form tables and refuses, before any recursive step reads it, data nested deep
#: enough to exhaust Python's recursion limit (about 1,000 frames).
SPEC_MAX_DEPTH = 32


def nesting_depth_path(value: Any, max_depth: int) -> list[str] | None:
    """Return the path (keys, list indexes as strings) of the first table or array of ``value``
    nested deeper than ``max_depth`` levels (``value`` itself is level 1), or None when there is
    none. Walks with an explicit stack, so any depth is measured without recursion."""
    stack: list[tuple[Any, list[str], int]] = [(value, [], 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, Mapping):
            children = [(str(key), item) for key, item in node.items()]
        elif isinstance(node, (list, tuple)):
            children = [(str(index), item) for index, item in enumerate(node)]
        else:
            continue
        if depth > max_depth:
            return path
        stack.extend((item, [*path, key], depth + 1) for key, item in reversed(children) if isinstance(item, (Mapping, list, tuple)))
    return None


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


def _check_json_like(value: Any, *, max_depth: int = JSON_MAX_DEPTH, max_items: int = JSON_MAX_ITEMS) -> Any:
    """Refuse values that are not small, finite JSON: depth, item count, string size.

    Raises ``PydanticCustomError`` whose context carries ``subpath``, the dotted path of
    the offending part inside the value, so problems point at ``env.0.args.x.2``.
    """
    items = 0

    def walk(node: Any, path: list[str], depth: int) -> None:
        nonlocal items
        subpath = ".".join(path)
        if depth > max_depth:
            raise PydanticCustomError(
                "too_deep", "nested deeper than {max_depth} levels",
                {"max_depth": max_depth, "subpath": subpath},
            )
        items += 1
        if items > max_items:
            raise PydanticCustomError(
                "too_long", "more than {max_items} values in all",
                {"max_items": max_items, "subpath": ""},
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
#: A whole config document kept as submitted: deeper and larger than :data:`JsonObject`
#: (prime-rl's tables nest ten levels), the same rules otherwise.
JsonDocument = Annotated[
    dict[str, Any], AfterValidator(lambda value: _check_json_like(value, max_depth=16, max_items=10_000))
]

#: A string that can be stored: no NUL, no unpaired surrogate.
Text = Annotated[str, AfterValidator(_check_text)]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(_check_text)]
MetadataValue = Annotated[str, StringConstraints(max_length=512), AfterValidator(_check_text)]


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
