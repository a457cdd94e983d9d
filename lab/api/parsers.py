"""The JSON parser of the API: DRF's, answering 400 instead of 500 for hostile nesting.

JSON nested deep enough to exhaust Python's recursion limit makes ``json.loads`` raise
RecursionError, which DRF's parser does not catch; here it is a ``ParseError`` (400). Strings a
database cannot store (NUL, unpaired surrogates) are refused by each body's own validation, so
the error names the field (``labsdk.spec`` for specs, ``jobs.ingest.schemas`` for engines).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class LabJSONParser(JSONParser):
    """DRF's JSON parser that answers 400, never 500, for nesting past the recursion limit."""

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON nested too deeply") from None
