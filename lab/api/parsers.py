"""Reading JSON request bodies with their nesting bounded: DRF's parser for the API, and
:func:`json_loads` for the views that read a raw body themselves (Stripe's webhook).

A body nested deeper than :data:`MAX_JSON_DEPTH` levels of objects and arrays is refused as a
whole (400 ``invalid_request`` through the API's error handler), so nothing that walks a body
recursively (spec checks, serializers, ``copy.deepcopy``) can exhaust Python's recursion limit
(about 1,000 frames, of which the web server's stack already holds a hundred or more). Lab's
bodies nest a dozen levels at most (a job spec's ``metadata`` values, 16 levels under the
spec). Strings a database cannot store (NUL, unpaired surrogates) are refused by each body's own
validation, so the error names the field (``labsdk.spec`` for specs, ``jobs.ingest.schemas``
for engines).
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

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


class LabJSONParser(JSONParser):
    """DRF's JSON parser that answers 400, never 500, for bodies nested past ``MAX_JSON_DEPTH``."""

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
            check_json_depth(data)
        except (RecursionError, JSONTooDeep):
            raise ParseError(f"the JSON body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels") from None
        return data
