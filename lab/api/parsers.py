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

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from lab.lib.jsonbounds import MAX_JSON_DEPTH, JSONTooDeep, check_json_depth, json_loads

__all__ = ["MAX_JSON_DEPTH", "JSONTooDeep", "LabJSONParser", "check_json_depth", "json_loads"]


class LabJSONParser(JSONParser):
    """DRF's JSON parser that answers 400, never 500, for bodies nested past ``MAX_JSON_DEPTH``."""

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
            check_json_depth(data)
        except (RecursionError, JSONTooDeep):
            raise ParseError(f"the JSON body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels") from None
        return data
