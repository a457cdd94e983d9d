"""Decoding JSON with its nesting bounded (``json_loads``), for the API's parser
(``lab.api.parsers``) and for every raw body read elsewhere (Stripe's webhook).

Nothing that walks a decoded body recursively can then exhaust Python's recursion limit; why
the bound is 64 is said in ``lab.api.parsers``.
"""

from __future__ import annotations

import json
from typing import Any

#: The deepest a JSON request body may nest objects and arrays (the body itself is level 1).
MAX_JSON_DEPTH = 64


class JSONTooDeep(ValueError):
    """A JSON text nests objects and arrays deeper than allowed."""

    def __init__(self, max_depth: int):
        super().__init__(f"JSON nested deeper than {max_depth} levels of objects and arrays")
        self.max_depth = max_depth


def check_json_depth(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`JSONTooDeep` when decoded JSON ``value`` nests objects and arrays deeper
    than ``max_depth`` levels (``value`` itself is level 1). Walks with an explicit stack, never
    recursion, so any depth is measured."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise JSONTooDeep(max_depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def json_loads(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode JSON ``text`` as ``json.loads`` does, refusing nesting deeper than ``max_depth``.

    Raises :class:`JSONTooDeep` (a ValueError) for deep nesting, also when the decoder itself
    runs out of stack, and ``json.JSONDecodeError``/``UnicodeDecodeError`` (ValueErrors) for
    text that is not JSON.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeep(max_depth) from None
    check_json_depth(value, max_depth=max_depth)
    return value
